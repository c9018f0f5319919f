"""What the host did to a measurement: CPU time stolen by the hypervisor over an interval.

On a shared VM the hypervisor can deschedule a vCPU for milliseconds at a time; a benchmark
point that ran while that happened often is slower for reasons outside the system under test.
Each live point records the stolen share of all CPU time (``/proc/stat``), so its reader can tell.
"""

from __future__ import annotations

from pathlib import Path

_STAT = Path("/proc/stat")


def cpu_times() -> tuple[int, ...] | None:
    """The aggregate CPU counters (user, nice, system, idle, iowait, irq, softirq, steal, ...),
    in clock ticks; None where /proc/stat is not there."""
    try:
        first = _STAT.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    return tuple(int(x) for x in first[1:]) if first and first[0] == "cpu" else None


def steal_share(before: tuple[int, ...] | None, after: tuple[int, ...] | None) -> float | None:
    """Stolen CPU time over all CPU time between two :func:`cpu_times` readings."""
    if before is None or after is None or len(before) < 8 or len(after) < 8:
        return None
    # guest time (fields 9-10) is already counted in user/nice
    deltas = [b - a for a, b in zip(before[:8], after[:8], strict=True)]
    total = sum(deltas)
    return deltas[7] / total if total > 0 else None
