"""The agent's authenticated gRPC API: token checks before a message is read, then the service."""
