"""Model pods as the agent sees them: converted from API objects, proven placed by the binder,
owned, and kept in step with the gateway's caller table."""
