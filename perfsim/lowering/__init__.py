"""perfsim.lowering."""
