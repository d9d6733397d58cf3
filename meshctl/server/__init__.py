"""Serve: the ADS server, its per-stream subscription state, pushes and the admin endpoints."""
