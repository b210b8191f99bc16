"""The node gateway: the one way from model pods to the node's Triton (see `proxy.gateway.app`)."""
