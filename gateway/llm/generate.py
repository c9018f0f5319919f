"""Triton's generate extension on the gateway's generative models: ``POST
/v2/models/{m}/generate`` (one JSON answer) and ``/generate_stream`` (server-sent events).

A request is a JSON object with ``text_input`` and the other inputs beside it or in its
``parameters`` (``max_tokens``, ``seed``, ``temperature``, ``top_p``, ``top_k``,
``ignore_eos``, ``stop``); it is served as an OpenAI completion of that prompt (relayed to
the model's engines as any other, :mod:`gateway.llm.relay`), and its answer read back as
Triton's: ``{"model_name", "model_version", "text_output"}`` with the generated text, one
such event per token when streamed. Errors are Triton's ``{"error": "..."}`` with the status
the OpenAI path gives (400, 404, 429, 502, 503).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, TypeVar

from gateway.frontdoor.httpserver import HttpResponse
from gateway.frontdoor.stream import StreamResponse
from gateway.llm.api import LlmCall, OpenAiError

T = TypeVar("T")
VERSION = "1"  # a generative model has one version, as Triton names it
_PASSED = ("max_tokens", "seed", "temperature", "top_p", "top_k", "ignore_eos", "stop")
_TYPES: dict[str, tuple[type, ...]] = {"max_tokens": (int,), "seed": (int,), "temperature": (int, float),
                                       "top_p": (int, float), "top_k": (int,), "ignore_eos": (bool,),
                                       "stop": (str, list)}
_IGNORED = frozenset({"id", "text_input", "parameters", "stream", "exclude_input_in_output"})


def error_response(status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> HttpResponse:
    return HttpResponse(status, json.dumps({"error": message}).encode(), "application/json", headers)


def read_generate(model: str, raw: bytes, stream: bool, max_depth: int = 64) -> LlmCall:
    """The generate request in ``raw`` as an OpenAI completion call; :class:`OpenAiError`
    (400) names what is wrong."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise OpenAiError(400, f"failed to parse the request JSON buffer: {e}") from None
    if not isinstance(body, dict):
        raise OpenAiError(400, f"the request must be a JSON object, got {type(body).__name__}")
    call = generate_call(model, body, stream)
    if _depth_over(call.body, max_depth):
        raise OpenAiError(400, f"request body nests deeper than {max_depth} levels")
    return call


def generate_call(model: str, body: dict[str, Any], stream: bool) -> LlmCall:
    """A generate request's inputs and ``parameters`` as an OpenAI completion call;
    :class:`OpenAiError` (400) names what is wrong."""
    text = body.get("text_input")
    if isinstance(text, list) and len(text) == 1:
        text = text[0]
    if not isinstance(text, str):
        raise OpenAiError(400, "expected a string `text_input` (the prompt)" if "text_input" in body
                          else "`text_input` is required: the prompt")
    params = body.get("parameters", {})
    if not isinstance(params, dict):
        raise OpenAiError(400, "`parameters` must be a JSON object")
    given = {**params, **{k: v for k, v in body.items() if k not in _IGNORED}}
    unknown = sorted(set(given) - set(_PASSED))
    if unknown:
        raise OpenAiError(400, f"unexpected input {unknown[0]!r} (this model takes text_input and "
                          f"{', '.join(_PASSED)})")
    out: dict[str, Any] = {"model": model, "prompt": text, "stream": stream}
    for name in _PASSED:
        v = given.get(name)
        if v is None:
            continue
        kinds = _TYPES[name]
        if type(v) not in kinds or (name in ("max_tokens", "top_k") and v < 1) or (name == "seed" and v < 0):
            need = "a boolean" if bool in kinds else "a string or a list of strings" if str in kinds else (
                "an integer at least 1" if name in ("max_tokens", "top_k") else
                "a non-negative integer" if name == "seed" else "a number")
            raise OpenAiError(400, f"`{name}` must be {need}, got {json.dumps(v)[:80]}", name)
        out[name] = v
    return LlmCall("completion", model, out, json.dumps(out).encode(), stream, False)


def _depth_over(doc: object, limit: int, depth: int = 0) -> bool:
    if depth > limit:
        return True
    if isinstance(doc, dict):
        return any(_depth_over(v, limit, depth + 1) for v in doc.values())
    if isinstance(doc, list):
        return any(_depth_over(v, limit, depth + 1) for v in doc)
    return False


def answer(resp: HttpResponse | StreamResponse, model: str) -> HttpResponse | StreamResponse:
    """The OpenAI path's answer to a generate request, as Triton gives it."""
    if isinstance(resp, StreamResponse):
        return StreamResponse(resp.status, Pieces(resp.chunks, lambda text, error: _event(model, text, error)),
                              resp.content_type, resp.headers, resp.aborted)
    try:
        doc = json.loads(resp.body)
    except ValueError:
        doc = None
    if resp.status != 200:
        return error_response(resp.status, _message(doc, resp.body), resp.headers)
    choices = doc.get("choices") if isinstance(doc, dict) else None
    text = "".join(str(c.get("text") or "") for c in choices or () if isinstance(c, dict))
    return HttpResponse(200, _output(model, text), "application/json", resp.headers)


def _output(model: str, text: str) -> bytes:
    return json.dumps({"model_name": model, "model_version": VERSION, "text_output": text}).encode()


def _message(doc: object, raw: bytes) -> str:
    """An OpenAI error's message (vLLM's older ``{"message"}`` too); else the body's text."""
    if isinstance(doc, dict):
        err = doc.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if isinstance(err, str):
            return err
        if "message" in doc:
            return str(doc["message"])
    return raw[:500].decode("utf-8", "replace")


def _event(model: str, text: str | None, error: str | None) -> bytes:
    doc = _output(model, text) if error is None else json.dumps({"error": error}).encode()  # type: ignore[arg-type]
    return b"data: " + doc + b"\n\n"


class Pieces(Generic[T]):
    """A relayed completion stream read as its pieces: each generated text, or an error, put
    through ``render(text, error)``; each step gives what one read of the relay carried.
    Closing it closes the relay (which settles the request, begun or not)."""

    __slots__ = ("chunks", "render", "rest")

    def __init__(self, chunks: AsyncIterator[bytes], render: Callable[[str | None, str | None], T]) -> None:
        self.chunks, self.render, self.rest = chunks, render, b""

    def __aiter__(self) -> Pieces[T]:
        return self

    async def __anext__(self) -> T:
        """The rendered pieces of the next read (bytes joined; others: the list)."""
        while True:
            data = self.rest + await self.chunks.__anext__()
            cut = data.rfind(b"\n\n") + 2
            self.rest = data[cut:] if cut >= 2 else data
            out: list = []
            for ev in data[:cut].split(b"\n\n") if cut >= 2 else ():
                ev = ev.strip()
                if not ev.startswith(b"data:") or ev == b"data: [DONE]":
                    continue
                try:
                    doc = json.loads(ev[5:])
                except ValueError:
                    continue
                if not isinstance(doc, dict):
                    continue
                if "error" in doc:
                    out.append(self.render(None, _message(doc, ev)))
                    continue
                text = "".join(str(c.get("text") or "") for c in doc.get("choices") or () if isinstance(c, dict))
                if text:
                    out.append(self.render(text, None))
            if out:
                return b"".join(out) if isinstance(out[0], bytes) else out  # type: ignore[return-value]

    async def aclose(self) -> None:
        await self.chunks.aclose()  # type: ignore[attr-defined]
