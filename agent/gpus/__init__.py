"""The node's GPUs: NVML read directly or through the relay in Triton's container, their inventory,
the memory each model uses, the reserve, foreign processes and the load turns."""
