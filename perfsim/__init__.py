"""perfsim"""
