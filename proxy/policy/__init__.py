"""What the proxy decides, whatever the protocol: which requests reach Triton (`routing`, the
isolation table), how many at once (`limiter`), and the refusals with their HTTP and gRPC answers
(`refusals`). `wire` reads the model name out of a gRPC request's protobuf bytes, which the
isolation table needs, so it sits here rather than under `proxy.grpc`. Imports no protocol layer.
"""
