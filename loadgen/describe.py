"""A load test's spec in words: its arrival process as reports name it, and validation errors
told in the command-line flags (``headrace load``, ``headrace sim``) that set its fields."""

from __future__ import annotations

from pydantic import ValidationError

from loadgen.spec import LoadSpec

FLAGS = {  # LoadSpec field -> the flag that sets it, where it is not --field-name
    "duration_s": "--duration",
    "warmup_s": "--warmup",
    "request_timeout_s": "--request-timeout",
    "window_s": "--window",
    "trace_models": "--trace-models",
    "time_scale": "--time-scale",
    "rate_scale": "--rate-scale",
    "trace_start_minute": "--trace-start-minute",
    "input_file": "--input-file",
    "input_dir": "--input-dir",
    "http_client": "--http-client",
    "slo_ms": "--slo-ms",
    "lag_warn_ms": "--lag-warn-ms",
    "tls": "--ssl",
    "model_keys": "--model-key",
}


def arrival_name(spec: LoadSpec) -> str | None:
    """The arrival process as reports name it (with its CV where it has one)."""
    if spec.mode != "open":
        return None
    if spec.arrival == "gamma":
        return f"gamma cv={spec.cv:g}"
    if spec.arrival == "trace" and spec.trace_cv != 1.0:
        return f"trace cv={spec.trace_cv:g}"
    return spec.arrival


def validation_message(e: ValidationError) -> str:
    """``e`` on one line, each field named by the flag that sets it, with the value given."""
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"])
        flag = FLAGS.get(loc, "--" + loc.replace("_", "-")) if loc else ""
        msg = err["msg"].removeprefix("Value error, ")
        val = f" = {err['input']!r}" if loc and not isinstance(err["input"], dict) else ""
        parts.append(f"{flag}{val}: {msg}" if flag else msg)
    return "; ".join(parts)
