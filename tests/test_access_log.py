"""Access logs: one JSON line per answered inference request with a fixed set of fields, off
by default, successes sampled by the configured fraction while refusals and errors are all
kept (unless they are sampled too), buffered off the request path and flushed on close."""

from __future__ import annotations

import asyncio
import io
import json
import random
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from gateway.accesslog import AccessLog

FIELDS = ["time", "tenant", "protocol", "model", "version", "variant", "status", "queue_ms", "total_ms",
          "rows", "reason", "request_id"]
JAN_1_2025_NOON = 1735732800.0


def make_log(sink: io.StringIO, **kw) -> AccessLog:
    return AccessLog(sink, rng=random.Random(7), wall=lambda: JAN_1_2025_NOON + 0.25, **kw)


def lines(sink: io.StringIO) -> list[dict]:
    return [json.loads(x) for x in sink.getvalue().splitlines()]


def served(log: AccessLog, n: int = 1) -> None:
    for i in range(n):
        log.answered("http", "m", 200, True, 0.0045, version="1", variant="m-fp16", queue_s=0.0012, rows=2,
                     request_id=f"r{i}", tenant="team-a")


def refused(log: AccessLog, n: int = 1) -> None:
    for _ in range(n):
        log.answered("grpc", "m", "RESOURCE_EXHAUSTED", False, 0.0002, reason="infeasible")


def spec(**kw) -> SimpleNamespace:
    return SimpleNamespace(**{"enabled": True, "sample": 1.0, "sample_failures": False, "path": None, **kw})


def test_off_by_default_means_no_log_object_at_all() -> None:
    # NOTE: off is None, so the front doors pay one `is None` check and build nothing
    assert AccessLog.from_settings(spec(enabled=False)) is None
    assert AccessLog.from_settings(spec(sample=0.0, sample_failures=True)) is None
    assert AccessLog.from_settings(spec(sample=0.0)) is not None  # failures are still logged


def test_a_served_request_is_one_json_line_with_every_field() -> None:
    sink = io.StringIO()
    log = make_log(sink)
    served(log)
    log.close()
    (rec,) = lines(sink)
    assert list(rec) == FIELDS
    assert rec == {"time": "2025-01-01T12:00:00.250Z", "tenant": "team-a", "protocol": "http", "model": "m",
                   "version": "1", "variant": "m-fp16", "status": 200, "queue_ms": 1.2, "total_ms": 4.5,
                   "rows": 2, "reason": None, "request_id": "r0"}


def test_a_refusal_carries_its_reason_and_grpc_code_name_with_unknowns_null() -> None:
    sink = io.StringIO()
    log = make_log(sink)
    refused(log)
    log.close()
    (rec,) = lines(sink)
    assert rec["status"] == "RESOURCE_EXHAUSTED" and rec["reason"] == "infeasible"
    assert rec["variant"] is None and rec["queue_ms"] is None and rec["tenant"] is None
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", rec["time"])


def test_successes_are_sampled_and_every_failure_is_kept() -> None:
    sink = io.StringIO()
    log = make_log(sink, sample=0.25)
    served(log, 4000)
    refused(log, 100)
    log.close()
    recs = lines(sink)
    ok = sum(r["status"] == 200 for r in recs)
    assert 900 <= ok <= 1100  # 25% of 4000, drawn independently
    assert sum(r["status"] == "RESOURCE_EXHAUSTED" for r in recs) == 100


def test_failures_are_sampled_too_when_asked() -> None:
    sink = io.StringIO()
    log = make_log(sink, sample=0.1, sample_failures=True)
    refused(log, 2000)
    log.close()
    assert 150 <= len(lines(sink)) <= 250


def test_on_an_event_loop_lines_wait_for_the_flush_instead_of_a_write_per_request() -> None:
    sink = io.StringIO()

    async def main() -> None:
        log = make_log(sink, flush_s=3600)
        served(log, 10)
        assert sink.getvalue() == ""  # buffered: no write on the request path
        log.flush()
        assert len(lines(sink)) == 10
        served(log, 1)
        log.close()  # what is left is written on close

    asyncio.run(main())
    assert len(lines(sink)) == 11


def test_a_file_path_is_appended_to(tmp_path: Path) -> None:
    path = tmp_path / "access.jsonl"
    path.write_text('{"earlier": true}\n')
    log = AccessLog.from_settings(spec(path=str(path)))
    served(log, 3)
    log.close()
    assert len(path.read_text().splitlines()) == 4


def test_an_unopenable_path_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(OSError, match=r"access_log.path: cannot open .*nope/access.jsonl"):
        AccessLog.from_settings(spec(path=str(tmp_path / "nope" / "access.jsonl")))
