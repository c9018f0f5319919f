"""What the gateway talks to: clients of the Triton replicas over gRPC and HTTP/1.1 (binary
tensors, metadata, ready probes) and the TLS they speak to Triton."""
