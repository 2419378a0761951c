"""perfsim.model.spec."""
