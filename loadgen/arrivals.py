"""Arrival processes: pure, seeded generators of send times (seconds from the run's start).

"When" is separate from "send": a driver asks a process for timestamps and sleeps until
each one. Every process takes an injected ``numpy.random.Generator``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Constant:
    rate: float  # requests per second

    def gaps(self, rng: np.random.Generator) -> Iterator[float]:
        while True:
            yield 1.0 / self.rate


@dataclass(frozen=True)
class Poisson:
    rate: float

    def gaps(self, rng: np.random.Generator) -> Iterator[float]:
        while True:
            yield from rng.exponential(1.0 / self.rate, 4096)


@dataclass(frozen=True)
class Gamma:
    """Gamma inter-arrival gaps: shape = 1/cv², scale = cv²/rate (cv = 1 is Poisson)."""

    rate: float
    cv: float = 1.0

    def gaps(self, rng: np.random.Generator) -> Iterator[float]:
        shape, scale = 1.0 / self.cv**2, self.cv**2 / self.rate
        while True:
            yield from rng.gamma(shape, scale, 4096)


def times(process: Constant | Poisson | Gamma, duration: float, rng: np.random.Generator) -> np.ndarray:
    """All arrival times in [0, duration) of one seeded run."""
    out: list[float] = []
    t = 0.0
    for g in process.gaps(rng):
        t += g
        if t >= duration:
            break
        out.append(t)
    return np.asarray(out)
