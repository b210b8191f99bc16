"""What the agent publishes: pod conditions, the Node's GPU annotations and capacity, and the pods
blamed for Triton's exits."""
