"""The run record in every JSON report: the whole spec (a run can be rebuilt from it), the
files read with their digests, headrace's version and the host's facts."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform

from loadgen.cli import register, spec_from_args
from loadgen.record import run_record
from loadgen.spec import LoadSpec


def parse(*args: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    register(ap.add_subparsers())
    return ap.parse_args(["load", *args])


def test_the_record_rebuilds_the_spec_with_every_option_that_shaped_the_run(tmp_path) -> None:
    a = parse("--target", "grpc://10.0.0.1:9001", "--mix", "a:3,b:1", "--arrival", "gamma",
              "--cv", "2.5", "--rate", "321", "--seed", "17", "--warmup", "2", "--duration", "30",
              "--connections", "12", "--request-timeout", "4", "--protocol", "json",
              "--slo-ms", "80", "--priority", "2", "--processes", "2", "--batch", "4")  # fmt: skip
    spec = spec_from_args(a)
    rec = json.loads(json.dumps(run_record(spec)))  # as the JSON file holds it
    s = rec["spec"]
    for key, value in {"arrival": "gamma", "cv": 2.5, "rate": 321.0, "seed": 17, "warmup_s": 2.0,
                       "duration_s": 30.0, "connections": 12, "request_timeout_s": 4.0,
                       "protocol": "json", "mix": "a:3,b:1", "slo_ms": 80.0, "processes": 2,
                       "batch": 4, "mode": "open"}.items():  # fmt: skip
        assert s[key] == value, key
    assert LoadSpec.model_validate(s) == spec


def test_the_record_names_version_host_and_the_files_read(tmp_path) -> None:
    ts = tmp_path / "ts.txt"
    ts.write_text("0\n0.5\n")
    rec = run_record(LoadSpec(target="http://h:1", model="m", arrival="timestamps", timestamps=ts),
                     {"search": {"trials": 3}})  # fmt: skip
    assert rec["search"] == {"trials": 3}
    digest = hashlib.sha256(ts.read_bytes()).hexdigest()
    assert rec["files"]["timestamps"] == {"path": str(ts), "sha256": digest}
    assert rec["headrace"]["version"]
    host = rec["host"]
    assert host["cpu_count"] == os.cpu_count() and host["python"] == platform.python_version()
    assert host["platform"] == platform.platform()
