"""Which variants answered, and the mean accuracy of the answers: the report's view of a
model served by several variants (the gateway names the one behind each answer).

A variant's accuracy is looked up by name in the reference and measured profile sets (the
names the operator gives Triton's models); a variant found in neither has no known accuracy,
and a model's mean is given only when every answering variant's accuracy is known.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from profiles.digits.family import MEASURED_DIR
from profiles.profile import ProfileSet


@lru_cache(maxsize=1)
def _known() -> dict[str, float]:
    out: dict[str, float] = {}
    for profiles in (ProfileSet.reference(), ProfileSet.load(MEASURED_DIR)):
        for p in profiles:
            if p.accuracy is not None:
                out.setdefault(p.variant, p.accuracy)
    return out


def accuracy_of(variant: str) -> float | None:
    return _known().get(variant)


def variant_mix(per_variant: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per model: each variant's share of the OK answers, and their mean accuracy (None when a
    variant's accuracy is unknown)."""
    by_model: dict[str, dict[str, int]] = {}
    for d in per_variant:
        if d["variant"] != "-" and d["ok"]:
            by_model.setdefault(d["model"], {})[d["variant"]] = d["ok"]
    out = {}
    for model, counts in sorted(by_model.items()):
        total = sum(counts.values())
        accs = {v: accuracy_of(v) for v in counts}
        known = all(a is not None for a in accs.values())
        out[model] = {"shares": {v: n / total for v, n in sorted(counts.items())},
                      "mean_accuracy": sum(n * accs[v] for v, n in counts.items()) / total if known else None}
    return out
