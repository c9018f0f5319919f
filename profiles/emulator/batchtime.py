"""How long one emulated batch takes: the profile's p50, or a seeded draw toward its p99."""

from __future__ import annotations

import math
import random

from profiles.profile import Profile


def batch_seconds(profile: Profile, rows: int, rng: random.Random | None = None) -> float:
    """Seconds for a batch of ``rows``: p50 when ``rng`` is None (deterministic); else half the
    batches take p50 and the rest have an exponential tail that reaches p99 at the 99th
    percentile, ``P(t > p50 + x * (p99 - p50)) = 0.5 * 50**-x``."""
    p50 = profile.latency(rows, "p50")
    if rng is None:
        return p50
    u = rng.random()
    if u <= 0.5:
        return p50
    x = math.log(0.5 / (1.0 - u)) / math.log(50.0)
    return p50 + x * (profile.latency(rows, "p99") - p50)
