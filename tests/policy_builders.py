"""Builders shared by the policy and simulator tests."""

from __future__ import annotations

from gateway.policy.types import Priority, ReplicaInfo, Request
from profiles.profile import LatencyPoint, Profile, Provenance


def fake_profile(a_ms: float = 8.4, c_ms: float = 2.346, max_batch: int = 32, floor_ms: float = 0.0,
                 p99_factor: float = 1.0, variant: str = "m", accuracy: float | None = None) -> Profile:
    """t(b) = max(floor, a + c*b) ms, linear between batch 1 and max_batch."""
    def t(b: int) -> float:
        return max(floor_ms, a_ms + c_ms * b) / 1e3
    pts = tuple(LatencyPoint(b, t(b), t(b) * p99_factor) for b in sorted({1, max_batch}))
    return Profile("m", variant, "A100-80GB", "1g.10gb", max_batch, pts, accuracy=accuracy,
                   provenance=Provenance("test", "fit"))


def replica(rid: str = "r0", profile: Profile | None = None, max_batch: int = 32,
            max_inflight: int = 1, model: str = "m") -> ReplicaInfo:
    profile = profile or fake_profile(max_batch=max_batch)
    return ReplicaInfo(rid, model, profile.variant, profile, max_batch, max_inflight)


def make_requests(n: int, slo: float = 0.1, start: float = 0.0, gap: float = 0.0, first_id: int = 0,
                  model: str = "m", priority: Priority = Priority.GUARANTEED, size: int = 1) -> list[Request]:
    return [Request(first_id + i, model, start + i * gap, start + i * gap + slo, priority, size)
            for i in range(n)]
