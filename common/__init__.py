"""What every part of tritonshare shares: the contract names, quantities, logging, lifecycle.

Nothing here knows about a specific part, Kubernetes client or Triton; parts meet only through
the names defined in `common.contract`.
"""
