"""The async front door: KServe v2 / Triton HTTP and gRPC, deadlines, EDF batching, early
admission and variant choice, in front of a pool of Triton replicas."""
