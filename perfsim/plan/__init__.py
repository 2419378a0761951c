"""perfsim.plan."""
