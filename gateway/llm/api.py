"""The OpenAI API as the gateway reads it: a request's checks, in OpenAI's error shape.

The gateway reads what it needs to route and measure a request (its model, whether it streams,
whether the client asked for ``usage`` in the stream, the token SLOs) and checks what a
client most often gets wrong (malformed JSON, chat messages, ``max_tokens``), answering each
with OpenAI's ``{"error": {"message", "type", "param", "code"}}`` and a 4xx. The engine checks
the rest (a prompt past its context, ``max_tokens`` past its length): its own 400 is relayed
unchanged.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gateway.frontdoor.httpserver import HttpResponse

TTFT_HEADER = "x-slo-ttft-ms"  # the Gateway API Inference Extension's names
TPOT_HEADER = "x-slo-tpot-ms"
MAX_SLO_MS = 3_600_000.0
_ROLES = frozenset({"system", "user", "assistant", "tool", "developer", "function"})
_KINDS = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 405: "BadRequestError",
          413: "BadRequestError", 429: "RateLimitError", 503: "ServiceUnavailableError"}


class OpenAiError(Exception):
    """An answer other than 200, in OpenAI's error shape."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 headers: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers

    def response(self) -> HttpResponse:
        return error_response(self.status, self.message, self.param, self.headers)


def error_response(status: int, message: str, param: str | None = None,
                   headers: tuple[tuple[str, str], ...] = ()) -> HttpResponse:
    body = {"error": {"message": message, "type": _KINDS.get(status, "APIError"), "param": param, "code": status}}
    return HttpResponse(status, json.dumps(body).encode(), "application/json", headers)


def unknown_model(name: str) -> OpenAiError:
    return OpenAiError(404, f"The model `{name}` does not exist.", "model")


@dataclass(frozen=True, slots=True)
class LlmCall:
    """One generative request as the gateway routes it."""

    kind: Literal["completion", "chat"]
    model: str
    body: dict[str, Any]  # the request as sent (its model renamed per replica on the way out)
    raw: bytes  # its bytes, sent on unchanged when nothing needs renaming
    stream: bool
    include_usage: bool  # the client asked for the usage chunk at the end of its stream


def read_call(kind: Literal["completion", "chat"], raw: bytes, max_depth: int = 64) -> LlmCall:
    """The request in ``raw`` checked; :class:`OpenAiError` (400) names what is wrong."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise OpenAiError(400, f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise OpenAiError(400, f"request body must be a JSON object, got {type(body).__name__}")
    if _depth(body, max_depth) > max_depth:
        raise OpenAiError(400, f"request body nests deeper than {max_depth} levels")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise OpenAiError(400, "`model` is required: the name of a served model (GET /v1/models)", "model")
    stream = _typed(body, "stream", bool, False)
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise OpenAiError(400, "`stream_options` must be an object", "stream_options")
        if not stream:
            raise OpenAiError(400, "`stream_options` is only allowed when `stream` is true", "stream_options")
        include_usage = _typed(options, "include_usage", bool, False, "stream_options.include_usage")
    for name in ("max_tokens", "max_completion_tokens", "n"):
        v = _typed(body, name, int, None)
        if v is not None and v < 1:
            raise OpenAiError(400, f"`{name}` must be at least 1, got {v}", name)
    if kind == "chat":
        _check_messages(body.get("messages"))
    else:
        _check_prompt(body.get("prompt"))
    return LlmCall(kind, model, body, raw, stream, include_usage)


def _typed(doc: dict, name: str, kind: type, default: Any, param: str | None = None) -> Any:
    v = doc.get(name)
    if v is None:
        return default
    if type(v) is not kind:  # bool is not an int here, nor an int a bool
        raise OpenAiError(400, f"`{param or name}` must be {'a boolean' if kind is bool else 'an integer'}, "
                          f"got {json.dumps(v)[:80]}", param or name)
    return v


def _check_messages(messages: object) -> None:
    if not isinstance(messages, list) or not messages:
        raise OpenAiError(400, "`messages` must be a non-empty list of {role, content} objects", "messages")
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise OpenAiError(400, f"`{where}` must be an object with `role` and `content`", where)
        role = m.get("role")
        if role not in _ROLES:
            raise OpenAiError(400, f"`{where}.role` must be one of {sorted(_ROLES)}, got {json.dumps(role)[:80]}",
                              f"{where}.role")
        content = m.get("content")
        if content is None and role in ("assistant", "tool", "function"):
            continue
        if isinstance(content, str):
            continue
        if isinstance(content, list) and all(isinstance(p, dict) and isinstance(p.get("type"), str)
                                             for p in content):
            continue
        raise OpenAiError(400, f"`{where}.content` must be a string or a list of content parts", f"{where}.content")


def _check_prompt(prompt: object) -> None:
    if isinstance(prompt, str):
        return
    if isinstance(prompt, list) and prompt and (
            all(isinstance(p, str) for p in prompt)
            or all(type(p) is int for p in prompt)
            or all(isinstance(p, list) and all(type(t) is int for t in p) for p in prompt)):
        return
    raise OpenAiError(400, "`prompt` must be a string, a list of strings, or token ids (a list of integers "
                      "or of lists of integers)", "prompt")


def _depth(doc: object, limit: int) -> int:
    """How deep ``doc`` nests (counting stops past ``limit``)."""
    depth, level = 0, [doc]
    while level and depth <= limit:
        depth += 1
        nxt: list = []
        for v in level:
            if isinstance(v, dict):
                nxt.extend(v.values())
            elif isinstance(v, list):
                nxt.extend(v)
        level = [v for v in nxt if isinstance(v, (dict, list))]
    return depth


def slo_ms(headers: Mapping[str, str], name: str, default_ms: float) -> float:
    """The SLO a request asks for in header ``name`` (ms), else ``default_ms``; in seconds."""
    raw = headers.get(name)
    if raw is None:
        return default_ms / 1e3
    try:
        v = float(raw)
    except ValueError:
        v = math.nan
    if not (0 < v <= MAX_SLO_MS):
        raise OpenAiError(400, f"header {name} must be a number of milliseconds in (0, {MAX_SLO_MS:g}], "
                          f"got {raw[:40]!r}", name)
    return v / 1e3
