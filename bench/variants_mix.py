"""The load points of bench.variants: a floor mix no single cheap variant meets, and the cost
each system measurably used.

Each request carries its own accuracy floor (``headrace_min_accuracy``): a share
``HIGH_SHARE`` asks for ``HIGH_FLOOR``, which only ViT-B/16 (top-1 0.8107) meets; the rest ask
for ``LOW_FLOOR``, which ResNet-50 (0.7613) meets too. Always ResNet-50 breaks the high floor on
its share; always ViT-B/16 meets every floor at ViT's price; an objective has to choose per
request. Requests are sent open loop (Poisson) from tritonclient's asyncio HTTP client, the
client users run, and latency counts from each request's scheduled send. A fixed system has
no choice to make and is sent no floor; every answer of every system is checked against its
own request's floor, and one below it is a miss (``below_floor``), whatever its latency.

Cost is what the answers used: the seconds each Triton model spent computing batches (Triton's
own ``compute_infer`` statistics, read before and after the point; on the emulated GPU the time
the slice is busy) times the slice's price, per 1,000 rows Triton answered over the same span.
A slice's idle time is not in it: every system holds the same two slices, and what the idle time
is worth depends on whether something else can use it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from bench.variants_step import Sent

HIGH_FLOOR = 0.80  # only ViT-B/16 (0.8107) meets it
LOW_FLOOR = 0.75  # ResNet-50 (0.7613) meets it too
HIGH_SHARE = 0.3  # of requests with the high floor


def floors(n: int, seed: int) -> list[float]:
    """Each of ``n`` requests' floor: ``HIGH_FLOOR`` with probability ``HIGH_SHARE``, else ``LOW_FLOOR``."""
    rng = np.random.default_rng(seed)
    return [HIGH_FLOOR if u < HIGH_SHARE else LOW_FLOOR for u in rng.random(n)]


def outcome(s: Sent, floor: float, accuracy: dict[str, float], slo: float) -> str:
    """``ok`` (answered in SLO by a variant meeting the floor), ``below_floor``, ``refused``
    (429/503), ``late`` or ``error`` (no answer)."""
    if s.variant is not None:
        if accuracy[s.variant] < floor:
            return "below_floor"
        return "ok" if s.latency is not None and s.latency <= slo else "late"
    return "refused" if s.status is not None else "error"


def busy_cost(triton: dict[str, dict[str, float]], price_per_hour: float) -> dict[str, Any]:
    """Busy slice-seconds per Triton model and in all, and their price per 1,000 answered rows."""
    busy = {m: d["compute_s"] for m, d in triton.items()}
    rows = sum(d["rows"] for d in triton.values())
    total = sum(busy.values())
    return {"busy_s": busy, "busy_s_total": total, "rows": rows,
            "cost_per_1000": total * price_per_hour / 3600 / rows * 1000 if rows else None}


def score(sents: Sequence[Sent], floor_of: Sequence[float], warmup: float, accuracy: dict[str, float],
          slo: float, variant_of: dict[str, str]) -> dict[str, Any]:
    """Over the requests scheduled after ``warmup``: attainment (``ok``), the misses by kind (all,
    and of the high-floor requests), the mean accuracy of the answers and their shares by variant."""
    idx = [i for i, s in enumerate(sents) if s.at >= warmup]
    each = {i: outcome(sents[i], floor_of[i], accuracy, slo) for i in idx}
    kinds = Counter(each.values())
    answered = [sents[i].variant for i in idx if sents[i].variant is not None]
    by_variant = Counter(variant_of[v] for v in answered)
    high = [i for i in idx if floor_of[i] == HIGH_FLOOR]
    return {"requests": len(idx), "high_floor_requests": len(high),
            "high_floor_misses": dict(sorted(Counter(each[i] for i in high if each[i] != "ok").items())),
            "attainment": kinds["ok"] / len(idx) if idx else None,
            "misses": {k: n for k, n in sorted(kinds.items()) if k != "ok"},
            "below_floor": kinds["below_floor"],
            "mean_accuracy": sum(accuracy[v] for v in answered) / len(answered) if answered else None,
            "shares": {v: n / len(answered) for v, n in sorted(by_variant.items())}}
