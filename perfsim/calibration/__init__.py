"""perfsim.calibration."""
