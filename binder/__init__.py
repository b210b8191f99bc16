"""binder."""
