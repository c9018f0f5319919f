"""The sans-IO policy core: requests, EDF queues, batcher, admission, variant selector and
replica choice. No clocks, no awaits, no I/O: ``now`` comes in, frozen decisions go out."""

from profiles import compiled

# built by ``headrace compile`` (profiles/compiled.py); declared before any of them is imported
COMPILED = compiled.declare(__name__, (
    "admission", "batching", "edf", "expiry", "migrate", "rate", "replica", "scheduler", "selector", "sequences",
    "sequencing", "types",
))

from gateway.policy.config import SchedulerConfig  # noqa: E402
from gateway.policy.scheduler import EdfScheduler  # noqa: E402

__all__ = ["COMPILED", "EdfScheduler", "SchedulerConfig"]
