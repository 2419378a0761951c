"""perfsim.cost."""
