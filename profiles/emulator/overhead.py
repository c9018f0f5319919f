"""Triton's own cost per batch, by which the emulated model ends each batch early.

A request through ``tritonclient`` -> tritonserver -> python-backend stub and back costs time
that is not the emulated GPU's: about 0.6 ms when the processes are busy, rising to about
1.5 ms when they have idled through a batch of 10 ms or more (waking idle threads is slower).
Ending every emulated batch that much early makes the latency measured through Triton match
the profile (and the sharing maths of :mod:`profiles.sharing`, which scale the whole batch).
:func:`profiles.emulator.calibrate.calibrate_overhead` measures it on the host at hand.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Overhead:
    """Seconds by which to end early a batch that should take ``latency`` seconds end to end:
    ``fixed_ms + idle_ms * min(1, latency / ramp_ms)``, never more than the batch itself."""

    fixed_ms: float = 0.6
    idle_ms: float = 0.9
    ramp_ms: float = 10.0

    def __post_init__(self) -> None:
        if self.fixed_ms < 0 or self.idle_ms < 0 or self.ramp_ms <= 0:
            raise ValueError(f"overhead needs fixed_ms >= 0, idle_ms >= 0, ramp_ms > 0; got {self}")

    @classmethod
    def none(cls) -> Overhead:
        return cls(0.0, 0.0, 1.0)

    def seconds(self, latency: float) -> float:
        ms = self.fixed_ms + self.idle_ms * min(1.0, latency * 1e3 / self.ramp_ms)
        return min(latency, ms / 1e3)

    def to_params(self) -> dict[str, str]:
        return {"overhead_fixed_ms": repr(self.fixed_ms), "overhead_idle_ms": repr(self.idle_ms),
                "overhead_ramp_ms": repr(self.ramp_ms)}

    @classmethod
    def from_params(cls, p: dict[str, str]) -> Overhead:
        return cls(float(p["overhead_fixed_ms"]), float(p["overhead_idle_ms"]), float(p["overhead_ramp_ms"]))


DEFAULT_OVERHEAD = Overhead()
