"""tritonshare agent: one per GPU node, beside Triton (see docs/agent.md)."""

__version__ = "0.1.0"
