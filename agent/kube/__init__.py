"""The agent's adapter to the Kubernetes API and its Event recorder."""
