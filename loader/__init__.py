"""loader."""
