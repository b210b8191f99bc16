"""Which models coincided with Triton's unexpected exits, and the rule that turns witnesses into
quarantine."""
