"""Pytest fixtures for the simulated cluster (filled in with sim/apiserver)."""
