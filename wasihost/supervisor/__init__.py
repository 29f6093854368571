"""Bounds on running extensions: the governor, scheduling, eviction and supervision."""
