"""The async front door: KServe v2 / Triton HTTP and gRPC, deadlines, EDF batching, early
admission and variant choice, in front of a pool of Triton replicas."""

from gateway import compiled as _compiled

_compiled.install()  # the policy core's builds, when there are any (gateway/compiled.py)
