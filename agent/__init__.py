"""tritonshare agent: one per GPU node, beside Triton (see docs/agent.md)."""

from common.version import VERSION

__version__ = VERSION
