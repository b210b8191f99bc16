"""The binder's door to the API server: its transport, the typed client, leader election and the
hand-offs between threads and the loop."""
