"""A Triton decoupled LLM model as an engine of a generative model, spoken to over Triton's
``generate_stream`` (HTTP server-sent events) and read back as an OpenAI-compatible engine's
answer, so the relay measures, renames and aborts it as any other engine's.

A completion's ``prompt`` (a string, or a list of one) or a chat's messages (rendered as
:func:`profiles.llm.tokens.chat_prompt` renders them) is sent as ``text_input`` with
``max_tokens``, ``stream: true`` and ``exclude_input_in_output: true`` (the inputs of the
emulated engine's model, of TensorRT-LLM's ensemble and of vLLM's backend); ``seed``,
``temperature``, ``top_p``, ``top_k`` and ``ignore_eos`` go as request parameters. Each event's
``text_output`` becomes one completion (or chat) chunk; the stream ends with the finish reason,
a usage chunk and ``[DONE]``. A whole answer is the stream's text joined. Triton's
``{"error": "..."}`` becomes OpenAI's error shape with Triton's status (an error event in a
stream, an error chunk). Triton does not count tokens: a prompt's tokens are counted with
:mod:`profiles.llm.tokens` (exact for the emulated engine), the completion's are its events.
Closing the connection is the abort, as for the other engines.
"""

from __future__ import annotations

import json
from typing import Any, Protocol
from urllib.parse import quote

from gateway.llm.api import LlmCall, OpenAiError, error_response
from profiles.llm.tokens import chat_prompt, encode

_PARAMETERS = ("seed", "temperature", "top_p", "top_k", "ignore_eos")
_COUNTING_VOCAB = 32_000  # any vocabulary counts a text's tokens the same
_COMPACT = {"separators": (",", ":")}


class _Body(Protocol):
    headers: dict[bytes, bytes]

    async def read(self) -> bytes | None: ...


def request(call: LlmCall, served: str) -> tuple[bytes, bytes, str]:
    """The path and body of ``generate_stream`` for ``call``, and its prompt's text;
    :class:`OpenAiError` (400) when the call cannot be put as text."""
    body = call.body
    if call.kind == "chat":
        prompt = chat_prompt([{"role": m.get("role", ""), "content": _text_of(m.get("content"))}
                              for m in body["messages"]])
    else:
        prompt = body["prompt"]
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise OpenAiError(400, "this model's engine (Triton) takes one text prompt, not token ids or a batch",
                              "prompt")
    out: dict[str, Any] = {"text_input": prompt, "stream": True, "exclude_input_in_output": True}
    max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
    if max_tokens is not None:
        out["max_tokens"] = max_tokens
    params = {k: body[k] for k in _PARAMETERS if body.get(k) is not None}
    if params:
        out["parameters"] = params
    path = f"/v2/models/{quote(served, safe='')}/generate_stream".encode()
    return path, json.dumps(out).encode(), prompt


def _text_of(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


class TritonAnswer:
    """Triton's answer to :func:`request`, read as an OpenAI-compatible engine's: ``read()``
    gives completion (or chat) chunks as events arrive, ``whole()`` the whole answer. ``status``
    is Triton's, as the relay reads it."""

    __slots__ = ("conn", "kind", "served", "status", "max_tokens", "prompt_tokens", "tokens", "rest", "ended",
                 "headers")

    def __init__(self, conn: _Body, call: LlmCall, served: str, status: int, prompt: str) -> None:
        self.conn, self.kind, self.served, self.status = conn, call.kind, served, status
        self.max_tokens = call.body.get("max_tokens") or call.body.get("max_completion_tokens")
        self.prompt_tokens = len(encode(prompt, _COUNTING_VOCAB))
        self.tokens = 0
        self.rest = b""
        self.ended = False
        self.headers = {b"content-type": b"application/json"}

    async def whole(self) -> bytes:
        raw = b"".join([p async for p in _drain(self.conn)])
        if self.status != 200:
            return _error_body(self.status, raw)
        text, error = [], None
        for doc in _events(raw):
            if "error" in doc:
                error = str(doc["error"])
                break
            text.append(str(doc.get("text_output", "")))
        if error is not None:
            self.status = 400 if self.status == 200 and not text else 502
            return _error_body(self.status, json.dumps({"error": error}).encode())
        self.tokens = sum(1 for t in text if t)
        content = "".join(text)
        choice: dict[str, Any] = ({"index": 0, "text": content, "logprobs": None} if self.kind == "completion"
                                  else {"index": 0, "message": {"role": "assistant", "content": content}})
        choice["finish_reason"] = self._finish()
        doc = {"id": "cmpl-triton", "object": "text_completion" if self.kind == "completion" else "chat.completion",
               "created": 0, "model": self.served, "choices": [choice], "usage": self._usage()}
        return json.dumps(doc, **_COMPACT).encode()  # type: ignore[arg-type]

    async def read(self) -> bytes | None:
        """The chunks made of what arrived since the last read; None after ``[DONE]``."""
        while not self.ended:
            data = await self.conn.read()
            if data is None:
                self.ended = True
                return self._chunk(None, self._finish()) + self._usage_chunk() + b"data: [DONE]\n\n"
            buf = self.rest + data
            cut = buf.rfind(b"\n\n") + 2
            if cut < 2:
                self.rest = buf
                continue
            self.rest = buf[cut:]
            out = []
            for doc in _events(buf[:cut]):
                if "error" in doc:
                    err = {"error": {"message": str(doc["error"]), "type": "APIError", "param": None, "code": 500}}
                    out.append(b"data: " + json.dumps(err).encode() + b"\n\n")
                    continue
                text = str(doc.get("text_output", ""))
                if text:
                    self.tokens += 1
                    out.append(self._chunk(text, None))
            if out:
                return b"".join(out)
        return None

    def _finish(self) -> str:
        return "length" if self.max_tokens is not None and self.tokens >= self.max_tokens else "stop"

    def _usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.tokens,
                "total_tokens": self.prompt_tokens + self.tokens}

    def _chunk(self, text: str | None, finish: str | None) -> bytes:
        if self.kind == "completion":
            choice: dict[str, Any] = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            obj = "text_completion"
        else:
            choice = {"index": 0, "delta": {} if text is None else {"content": text}, "finish_reason": finish}
            obj = "chat.completion.chunk"
        doc = {"id": "cmpl-triton", "object": obj, "created": 0, "model": self.served, "choices": [choice]}
        return b"data: " + json.dumps(doc, **_COMPACT).encode() + b"\n\n"  # type: ignore[arg-type]

    def _usage_chunk(self) -> bytes:
        doc = {"id": "cmpl-triton", "object": "text_completion" if self.kind == "completion"
               else "chat.completion.chunk", "created": 0, "model": self.served, "choices": [],
               "usage": self._usage()}
        return b"data: " + json.dumps(doc, **_COMPACT).encode() + b"\n\n"  # type: ignore[arg-type]


async def _drain(conn: _Body):  # noqa: ANN202
    while (data := await conn.read()) is not None:
        yield data


def _events(raw: bytes) -> list[dict]:
    """The JSON documents of the ``data:`` events in ``raw`` (others skipped)."""
    docs = []
    for ev in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        ev = ev.strip()
        if not ev.startswith(b"data:"):
            continue
        try:
            doc = json.loads(ev[5:])
        except ValueError:
            continue
        if isinstance(doc, dict):
            docs.append(doc)
    return docs


def _error_body(status: int, raw: bytes) -> bytes:
    """Triton's ``{"error": "..."}`` (or any body) in OpenAI's error shape."""
    try:
        message = str(json.loads(raw)["error"])
    except (ValueError, KeyError, TypeError):
        message = raw[:500].decode("utf-8", "replace")
    return error_response(status, message).body
