"""Simulated GPUs: the mock NVML module that stands in for pynvml (`nvml`), GPU models (`spec`),
what loaded models occupy (`load`), and the agent run on them (`agent_node`)."""
