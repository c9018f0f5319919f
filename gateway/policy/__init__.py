"""The sans-IO policy core: requests, EDF queues, batcher, admission, variant selector and
replica choice. No clocks, no awaits, no I/O: ``now`` comes in, frozen decisions go out."""

from gateway.policy.config import SchedulerConfig
from gateway.policy.scheduler import EdfScheduler

__all__ = ["EdfScheduler", "SchedulerConfig"]
