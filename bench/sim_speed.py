"""How fast ``headrace sim`` runs: simulated requests per wall minute on one core.

Each case is one ``headrace sim`` command run in this process (its whole work: arrivals, the
gateway's own ``EdfScheduler`` in virtual time, the load-test recorder and report), timed
with ``time.perf_counter``; the best of ``--repeat`` runs counts (a busy host only slows a
run down). The target is 1.5M simulated requests per wall minute per core with the default
policy. Cases:

- ``issue``: one ResNet-50 replica on a 1g.10gb slice at 330 req/s Poisson, 600 s virtual
  (the run the speed was first measured on: about 198k requests);
- ``fleet``: four replicas at 1,300 req/s of Gamma cv 4 arrivals, 150 s virtual.

Run it under the machine-wide bench lock::

    flock /tmp/headrace-bench.lock .venv/bin/python -m bench.sim_speed
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.output import write_results

TARGET_PER_MIN = 1.5e6
CASES: dict[str, list[str]] = {
    "issue": ["--rate", "330", "--arrival", "poisson", "--duration", "600"],
    "fleet": ["--replicas", "4", "--rate", "1300", "--arrival", "gamma", "--cv", "4", "--duration", "150"],
}


def run_case(args: list[str]) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds of this process, simulated requests) of one ``headrace sim``
    run; on a shared host the CPU seconds say what the run itself cost."""
    from deploy.cli import main

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "s.json"
        sink = io.StringIO()
        t0, c0 = time.perf_counter(), time.process_time()
        with contextlib.redirect_stdout(sink):
            rc = main(["sim", *args, "--seed", "0", "--json", str(out)])
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if rc != 0:
            raise RuntimeError(f"headrace sim {' '.join(args)} exited {rc}")
        s = json.loads(out.read_text())
    return wall, cpu, int(s["offered"]) + int(s.get("warmup_offered", 0))


def measure(repeat: int) -> dict[str, Any]:
    cases = {}
    for name, args in CASES.items():
        runs = [run_case(args) for _ in range(repeat)]
        wall, cpu, n = min(runs)
        cases[name] = {"command": "headrace sim " + " ".join(args), "requests": n,
                       "wall_s": [round(w, 3) for w, _, _ in runs], "best_wall_s": round(wall, 3),
                       "cpu_s": round(cpu, 3), "requests_per_wall_minute": round(n / wall * 60),
                       "requests_per_cpu_minute": round(n / cpu * 60)}
    return cases


def markdown(res: dict[str, Any]) -> str:
    lines = ["# headrace sim: simulated requests per wall minute (one core)", "",
             f"Target: {TARGET_PER_MIN / 1e6:.1f}M per wall minute per core with the default policy. "
             f"Host: {res['host']['cpus']} CPUs, Python {res['host']['python']}; best of "
             f"{res['repeat']} runs, each a whole `headrace sim` command in-process; host load average "
             f"{res['host']['load_average']:.2f} at the start. The process is single-threaded, so its CPU "
             "seconds are the wall time of one free core: the target is judged on them (a shared "
             "host's other work stretches wall time, not CPU time).", "",
             "| case | command | requests | wall s | CPU s | per wall minute | per CPU minute | target met |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    for name, c in res["cases"].items():
        met = "yes" if c["requests_per_cpu_minute"] >= TARGET_PER_MIN else "no"
        lines.append(f"| {name} | `{c['command']}` | {c['requests']:,} | {c['best_wall_s']:.2f} | "
                     f"{c['cpu_s']:.2f} | {c['requests_per_wall_minute'] / 1e6:.2f}M | "
                     f"{c['requests_per_cpu_minute'] / 1e6:.2f}M | {met} |")
    if res.get("baseline"):
        lines += ["", "Before (the same commands on the simulator before its speed-ups, "
                  f"commit {res['baseline']['commit']}):", ""]
        for name, c in res["baseline"]["cases"].items():
            lines.append(f"- {name}: {c['requests_per_wall_minute'] / 1e6:.2f}M per wall minute, "
                         f"{c['requests_per_cpu_minute'] / 1e6:.2f}M per CPU minute "
                         f"({c['requests']:,} requests in {c['best_wall_s']:.2f} s wall, {c['cpu_s']:.2f} s CPU)")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--name", default="sim_speed")
    ap.add_argument("--baseline", help="an earlier result JSON to show beside this one")
    a = ap.parse_args()
    host = {"cpus": os.cpu_count(), "python": platform.python_version(), "load_average": os.getloadavg()[0]}
    res: dict[str, Any] = {"repeat": a.repeat, "host": host, "cases": measure(a.repeat)}
    if a.baseline:
        res["baseline"] = json.loads(Path(a.baseline).read_text())
        res["baseline"].pop("baseline", None)
    from loadgen.record import headrace_version

    res["commit"] = headrace_version()["commit"]
    write_results(a.out, a.name, res, markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
