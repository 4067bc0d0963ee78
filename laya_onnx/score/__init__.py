"""Offline scoring: a file of states answered in one process (`scorer`) or through Ray Data
(`ray_data`)."""
