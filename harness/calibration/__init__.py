"""Calibration: the simulator's efficiency factors fitted to measured rows (``troughput-calibrate``)."""
