"""perfsim.system."""
