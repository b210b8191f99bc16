"""The gRPC front door, two ways. The HTTP/2 relay, followed from the tenant's socket to Triton's:
`server` (the listener; owns the tenant connections and the channels to Triton) accepts a
`relay.H2Connection` per tenant connection, which reads checked frames (`proxy.http2.reader`),
decodes header blocks and opens streams; `intake` reads each stream's messages (inflated by
`messages`), which `gate` checks against `proxy.policy.routing` and admits to a limiter slot, then
hands the bytes to `channel` (the one HTTP/2 connection to Triton, shared by every tenant);
Triton's answers come back through `channel` to `replies`, which writes them to the tenant within
its windows. `grpcio` is the grpc.aio fallback (`--grpc-mode grpcio`) with the same isolation
table.

Uses `proxy.http2` and `proxy.policy`; never `proxy.http1`.
"""
