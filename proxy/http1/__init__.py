"""HTTP/1.1 for the REST relay: strict framing (`framing`), the listener that prepares request heads
(`listener`), one tenant connection (`relay`) and the pooled connections to Triton (`upstream`).

May use `proxy.policy` (routing, limiter, refusals); knows nothing of HTTP/2 or gRPC.
"""
