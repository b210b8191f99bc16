"""The built-in autoscaler: Knative's arithmetic, the loop that reads the proxies' counts, what it
scales, and scale to zero (parking and waking)."""
