"""Real-time-free physics of one emulated physical GPU: concurrent jobs progressing at the
rates :func:`profiles.sharing.progress_rates` gives, advanced piecewise between events.

Pure: time comes in as ``now`` (seconds, any monotonic origin). The arbiter drives it with
the wall clock; tests drive it with plain numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from profiles.sharing import ActiveJob, progress_rates

EPS = 1e-9  # seconds of remaining work below which a job counts as done


@dataclass
class _Running:
    job: ActiveJob
    remaining: float  # seconds of solo work left
    started: float
    rate: float = 1.0


@dataclass(frozen=True)
class Finished:
    job_id: int
    started: float
    finished: float


class SharedGpu:
    """Jobs (one executing batch each) on the slices of one GPU, progressing in shared time.

    ``start`` and ``advance`` must be called with non-decreasing ``now``; a ``now`` earlier
    than the last event is treated as the last event (time never runs backwards).
    """

    def __init__(self) -> None:
        self._jobs: dict[int, _Running] = {}
        self._now: float | None = None

    @property
    def now(self) -> float | None:
        return self._now

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, job_id: int) -> bool:
        return job_id in self._jobs

    def start(self, job_id: int, job: ActiveJob, work: float, now: float) -> list[Finished]:
        """Add a job needing ``work`` solo seconds at ``now``; returns jobs finished before it."""
        if work < 0:
            raise ValueError(f"job {job_id}: work ({work}) must be >= 0")
        if job_id in self._jobs:
            raise ValueError(f"job {job_id} is already running")
        done = self.advance(now)
        self._jobs[job_id] = _Running(job, work, self._clock(now))
        self._rerate()
        return done

    def cancel(self, job_id: int, now: float) -> list[Finished]:
        """Drop a job (its client went away); the others speed up from ``now``."""
        done = self.advance(now)
        if self._jobs.pop(job_id, None) is not None:
            self._rerate()
        return done

    def advance(self, now: float) -> list[Finished]:
        """Move time to ``now``; jobs that complete on the way are removed and returned, each
        completion re-rating the rest exactly when it happens."""
        now = self._clock(now)
        out: list[Finished] = []
        while self._jobs:
            t_next = self.next_completion()
            if t_next is None or t_next > now:
                break
            self._progress(t_next)
            for jid in [j for j, r in self._jobs.items() if r.remaining <= EPS]:
                out.append(Finished(jid, self._jobs.pop(jid).started, t_next))
            self._rerate()
        self._progress(now)
        return out

    def predicted_completions(self) -> dict[int, float]:
        """When each running job would finish if nothing starts or ends before then."""
        if self._now is None:
            return {}
        return {
            jid: self._now + (r.remaining / r.rate if r.rate > 0 else float("inf"))
            for jid, r in self._jobs.items()
        }

    def next_completion(self) -> float | None:
        times = self.predicted_completions()
        return min(times.values()) if times else None

    def rates(self) -> dict[int, float]:
        return {jid: r.rate for jid, r in self._jobs.items()}

    # ------------------------------------------------------------------ internals

    def _clock(self, now: float) -> float:
        if self._now is None:
            self._now = now
        return max(now, self._now)

    def _progress(self, t: float) -> None:
        if self._now is None:
            self._now = t
            return
        dt = t - self._now
        if dt > 0:
            for r in self._jobs.values():
                r.remaining = max(0.0, r.remaining - dt * r.rate)
            self._now = t

    def _rerate(self) -> None:
        ids = list(self._jobs)
        for jid, rate in zip(ids, progress_rates([self._jobs[j].job for j in ids]), strict=True):
            self._jobs[jid].rate = rate
