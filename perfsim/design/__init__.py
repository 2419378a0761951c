"""perfsim.design."""
