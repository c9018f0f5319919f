"""The claims about front door isolation: what one attacking client leaves everyone else
(``bench.isolation``) and what the limits cost per request (``bench.isolation_cost``)."""

from __future__ import annotations

from typing import Any

from bench.claims_common import Claim, Results, pct


def _rows(d: dict[str, Any], system: str) -> dict[str, dict[str, Any]]:
    return {r["attack"]: r for r in d["rows"] if r["system"] == system}


def isolation(r: Results) -> list[Claim]:
    d, c = r["isolation"], r["isolation_cost"]
    hr, tr = _rows(d, "headrace"), _rows(d, "triton")
    base = hr["none"]["attainment"]
    held = [a for a, x in d["verdict"]["per_attack"].items() if x["met"]]
    cost = {x["client"].split()[-1]: x["added_cpu_us"] for x in c["rows"]}
    return [
        Claim("one client cannot take service from others (each attack of `loadgen.attacks` at full scale, "
              "a tritonclient load at half capacity beside it)",
              f"attainment within 1 point of the run without an attack ({pct(base)}) under {len(held)} of "
              f"{len(d['verdict']['per_attack'])} attacks ({', '.join(held)}); probes p99 at most "
              f"{max(hr[a]['probe_p99_ms'] for a in held):.0f} ms under them; a valid 60 MiB request answered "
              f"under {sum(x['big_ok'] for a, x in hr.items() if a != 'none')} of {len(hr) - 1}. Triton under "
              f"the same attacks: {pct(min(x['attainment'] for x in tr.values()))} at worst, its probes p99 at "
              f"most {max(x['probe_p99_ms'] for x in tr.values()):.0f} ms",
              ("isolation",)),
        Claim("what the isolation limits cost (gateway CPU per request, tritonclient at concurrency 1, "
              "3 processes per build)",
              f"HTTP {cost['http']:+.1f} µs, gRPC {cost['grpc']:+.1f} µs against the build before them",
              ("isolation_cost",)),
    ]


def isolation_gaps(r: Results) -> list[str]:
    d, c = r["isolation"], r["isolation_cost"]
    hr = _rows(d, "headrace")
    out = []
    for attack, v in d["verdict"]["per_attack"].items():
        if not v["met"]:
            x = hr[attack]
            out.append(f"**Isolation under `{attack}`**: the well-behaved client's attainment drops "
                       f"{v['drop_points']:.1f} points ({pct(x['attainment'])}, p99 {x['p99_ms']:.0f} ms, probes p99 "
                       f"{x['probe_p99_ms']:.0f} ms): the target is within 1 point.")
    slow = {a: x["probe_p99_ms"] for a, x in hr.items() if a != "none" and x["probe_p99_ms"] > 100.0}
    if slow:
        out.append("**Health probes under attack**: p99 " + ", ".join(f"{v:.0f} ms ({a})" for a, v in slow.items())
                   + ", above the 100 ms target: the event loop is busy with the attacker's large bodies and answers "
                   "(read, joined, concatenated and written whole), not with per-value work.")
    peak = {a: x["rss_peak_mib"] - x["rss_before_mib"] for a, x in hr.items() if a == "queued"}
    for a, grew in peak.items():
        if grew > 256 + 128 + 128:
            out.append(f"**Memory under `{a}`**: the gateway's RSS grows {grew:.0f} MiB, past what its queue and buffer "
                       "bounds allow (256 + 128 MiB per client): large answers in flight are not bounded.")
    for x in c["rows"]:
        if not x["met"]:
            out.append(f"**What isolation costs, {x['client']}**: {x['added_cpu_us']:+.1f} µs of gateway CPU per "
                       f"request against the build before it; the target is at most "
                       f"+{c['settings']['limit_us']:g} µs.")
    return out
