"""Writes ``azure_sample.csv``: a small *synthetic* trace in the Azure Functions 2019
per-minute format (``HashOwner,HashApp,HashFunction,Trigger,1..1440``), for tests and demos.

Run: ``python -m loadgen.data.make_azure_sample [OUT]``. Seeded, so the file is reproducible.
Eight functions with a diurnal shape, Poisson noise, a few bursts and idle stretches, the kinds
of pattern the real data set shows. It contains no real data.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np

MINUTES = 1440
TRIGGERS = ("http", "queue", "timer", "event", "http", "http", "storage", "orchestration")


def _hash(kind: str, i: int) -> str:
    return hashlib.sha256(f"headrace-sample-{kind}-{i}".encode()).hexdigest()


def make(seed: int = 2019) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    minute = np.arange(MINUTES)
    rows = []
    for i, trigger in enumerate(TRIGGERS):
        base = rng.uniform(2, 60) * (
            1 + 0.6 * np.sin(2 * np.pi * (minute / MINUTES - rng.random()))
        )
        if trigger == "timer":  # fires every few minutes, fixed count
            counts = np.where(minute % (i + 2) == 0, int(base.mean()), 0)
        else:
            counts = rng.poisson(base)
            for _ in range(rng.integers(1, 4)):  # bursts
                start = int(rng.integers(0, MINUTES - 10))
                counts[start : start + int(rng.integers(2, 10))] *= int(rng.integers(4, 12))
            idle = int(rng.integers(0, MINUTES - 60))
            counts[idle : idle + int(rng.integers(0, 60))] = 0
        rows.append(
            [_hash("owner", i // 3), _hash("app", i // 2), _hash("func", i), trigger]
            + [str(int(c)) for c in counts]
        )
    return rows


def write(path: Path, seed: int = 2019) -> None:
    header = ["HashOwner", "HashApp", "HashFunction", "Trigger"] + [
        str(m) for m in range(1, MINUTES + 1)
    ]
    lines = [",".join(header)] + [",".join(r) for r in make(seed)]
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    write(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("azure_sample.csv"))
