"""Clipper's AIMD batcher (the ``aimd`` baseline): the batch cap grows by one per batch that
meets the SLO, shrinks by 10% after one that does not, per replica, in arrival order."""

from __future__ import annotations

from gateway.policy import EdfScheduler, SchedulerConfig
from tests.policy_builders import make_requests, replica


def _sizes(s: EdfScheduler, rid: str, n: int, t0: float = 0.0) -> list[int]:
    """The rows of ``n`` batches in a row on replica ``rid``, each completed before the next."""
    out, now = [], t0
    for _ in range(n):
        (b,) = [b for b in s.poll(now).batches if b.replica == rid]
        out.append(b.rows)
        now += 0.001
        s.on_complete(b, now)
    return out


def test_aimd_grows_by_one_until_the_slo_then_backs_off_by_ten_percent() -> None:
    s = EdfScheduler(SchedulerConfig(policy="aimd"))
    s.add_replica(replica("r0"), 0.0)  # t(b) = 8.4 + 2.346 b ms: b <= 17 meets 50 ms
    for r in make_requests(2000, slo=0.05):
        assert s.submit(r, 0.0) is None  # no admission: Clipper's batcher queues everything
    sizes = _sizes(s, "r0", 24)
    assert sizes[:17] == list(range(1, 18))
    # 18 rows take 50.6 ms > 50 ms: the next cap is int(18 * 0.9) = 16, then it climbs again
    assert sizes[17:21] == [18, 16, 17, 18]
    assert max(sizes) == 18


def test_aimd_keeps_one_cap_per_replica() -> None:
    s = EdfScheduler(SchedulerConfig(policy="aimd"))
    s.add_replica(replica("r0"), 0.0)
    for r in make_requests(200, slo=0.05):
        s.submit(r, 0.0)
    assert _sizes(s, "r0", 5) == [1, 2, 3, 4, 5]
    s.add_replica(replica("r1"), 0.01)
    rows: dict[str, list[int]] = {"r0": [], "r1": []}
    for k in range(3):
        now = 0.01 + k * 0.001
        batches = s.poll(now).batches
        for b in batches:
            rows[b.replica].append(b.rows)
            s.on_complete(b, now + 0.0005)
    # the new replica starts at one, whatever r0 has learned
    assert rows == {"r0": [6, 7, 8], "r1": [1, 2, 3]}
