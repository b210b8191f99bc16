"""HTTP/2 itself, below any relay: frames (`frames` writes them, `reader` checks what a peer sends),
HPACK and request field rules (`headers`), flow-control windows (`flow`) and stream states
(`state`). Pure: no sockets, no event loop, nothing about gRPC, Triton or tenants; imports no
other layer of the proxy.
"""
