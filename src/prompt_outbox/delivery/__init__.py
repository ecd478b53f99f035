"""Delivery: the per-session step, periodic maintenance and the run loop that schedules them."""
