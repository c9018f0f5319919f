"""How co-located work shares one GPU: the one definition of the sharing rules.

The emulated GPU's arbiter, the simulator and the placement capacity model all use these
functions, so an emulated slice, a simulated slice and a planned slice behave alike.

Rules (a *job* is one batch executing; its *work* is its solo latency on the slice):
- MIG: jobs on different slices never affect each other (``slice_id`` differs).
- MPS: a client with active-thread share ``p`` progresses at ``p`` of solo speed; when the
  active shares on a slice add up past 1 they are scaled down proportionally; when another
  client is busy at the same time each job also pays the profile's interference factor.
- Time-slicing (plain co-location, no MPS): the busy jobs on a slice take equal turns.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from profiles.profile import Profile, Quantile

SharingMode = Literal["mps", "timeslice"]


@dataclass(frozen=True)
class ActiveJob:
    slice_id: str
    client: str
    mode: SharingMode = "timeslice"
    share: float = 1.0  # MPS active-thread fraction in (0, 1]
    interference: float = 0.0  # fractional slowdown while another MPS client is busy


def progress_rates(jobs: Sequence[ActiveJob]) -> list[float]:
    """Fraction of solo speed at which each active job progresses right now."""
    by_slice: dict[str, list[int]] = defaultdict(list)
    for i, j in enumerate(jobs):
        by_slice[j.slice_id].append(i)
    rates = [0.0] * len(jobs)
    for idx in by_slice.values():
        modes = {jobs[i].mode for i in idx}
        if modes == {"mps"}:
            total = sum(jobs[i].share for i in idx)
            scale = 1.0 / total if total > 1.0 else 1.0
            clients = {jobs[i].client for i in idx}
            for i in idx:
                slow = 1.0 + jobs[i].interference if len(clients) > 1 else 1.0
                # jobs of one client split that client's share
                same = sum(1 for k in idx if jobs[k].client == jobs[i].client)
                rates[i] = jobs[i].share * scale / slow / same
        else:
            # time-slicing (or any mix with it): equal turns among busy jobs
            for i in idx:
                rates[i] = 1.0 / len(idx)
    return rates


def mps_latency(profile: Profile, batch: int, share: float, busy_neighbours: bool,
                quantile: Quantile = "p99") -> float:
    """Seconds for one batch of a client holding ``share`` of an MPS slice (steady state)."""
    slow = 1.0 + profile.mps_interference if busy_neighbours else 1.0
    return profile.latency(batch, quantile) / share * slow


def timeslice_latency(profile: Profile, batch: int, busy_tenants: int, quantile: Quantile = "p99") -> float:
    """Seconds for one batch when ``busy_tenants`` (>=1) jobs take turns on the slice."""
    return profile.latency(batch, quantile) * max(1, busy_tenants)
