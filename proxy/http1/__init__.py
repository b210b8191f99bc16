"""HTTP/1.1 for the REST relay, followed from the tenant's socket to Triton's: the listener that
prepares request heads (`listener`), one tenant connection's exchanges (`relay`; `renaming` where
Triton's answers name a private name, renamed by `answers`) on its socket (`connection`), what
becomes of each request, decided without I/O (`cycle`, as h11's Connection), what a request must
pass (`gate`: the head's admission, the body's checks), the pooled connections to Triton
(`upstream`), strict framing (`framing`).

May use `proxy.policy` (routing, limiter, refusals); knows nothing of HTTP/2 or gRPC.
"""
