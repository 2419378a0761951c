"""perfsim.estimators."""
