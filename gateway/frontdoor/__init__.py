"""What clients talk to: the KServe v2 / Triton HTTP and gRPC front doors, their HTTP/1.1 server,
limits, TLS, tenants and API keys, and the Triton-shaped metadata and statistics they answer."""
