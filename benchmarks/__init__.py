"""Scripts that print figures side by side with a baseline (`python -m benchmarks.NAME`)."""
