"""The OpenAI wire format of the emulated LLM engine, as vLLM 0.32's OpenAI server speaks it.

Requests: ``/v1/completions`` and ``/v1/chat/completions`` bodies, read into a plain
:class:`Generation` (prompt token ids, ``max_tokens``, seed, streaming). Answers: the JSON of a
whole completion, the SSE chunks of a streamed one (built from bytes fixed per request, so a
token costs one string escape), and errors in vLLM's shape, ``{"error": {"message", "type",
"param", "code"}}``, worded as vLLM 0.32 words them.

- A prompt is text, one text in a list, or a list of token ids (completions); a chat is its
  messages as :func:`profiles.llm.tokens.chat_prompt` renders them.
- ``max_tokens`` defaults to 16 for completions and to the rest of the context for chat
  (vLLM's defaults); chat also takes ``max_completion_tokens``, which wins when given.
- The context, checked in vLLM 0.32's order (``vllm/renderers/params.py``,
  ``get_max_tokens``, ``vllm/sampling_params.py``, the engine's input processor): a
  ``max_tokens`` above ``max_model_len`` is refused; a prompt longer than the context is refused
  whatever ``max_tokens`` is (a text prompt is counted to one token past the context, as vLLM's
  tokenizer truncates it there, hence "at least"); a ``max_tokens`` that runs past the context
  is shortened to the rest of it, and one that comes to below 1 (a prompt filling the context)
  is refused; then an empty prompt, then a token id out of the vocabulary.
- ``seed`` sets the tokens; without one the seed is the CRC-32 of the prompt's token ids, so
  equal prompts give equal text, whatever else is running.
- ``n`` above 1 is refused (400); ``ignore_eos`` is accepted (the engine never samples an end
  of sequence, so every answer ends for ``length``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from profiles.llm.tokens import chat_prompt, default_seed, encode


class ApiError(Exception):
    """An answer other than 200, as vLLM's ``ErrorResponse`` carries it."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError", param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


def _validation(message: str, param: str | None = None, value: object = None) -> ApiError:
    """A 400 worded as vLLM's ``VLLMValidationError`` prints: the parameter and value, when it
    names them, after the message."""
    extras = [f"{k}={v}" for k, v in (("parameter", param), ("value", value)) if v is not None]
    return ApiError(400, f"{message} ({', '.join(extras)})" if extras else message, param=param)


def _fit(ids: list[int], counted: int, requested: int | None, param: str, vocab_size: int,
         max_model_len: int) -> int:
    """The ``max_tokens`` the engine runs for a prompt of ``counted`` tokens (``ids``), or the
    400 vLLM answers, checked in its order."""
    limit = max_model_len
    if requested is not None and requested > limit:
        raise _validation(f"{param}={requested} cannot be greater than max_model_len={limit}. "
                          f"Please request fewer output tokens.", param, requested)
    if counted > limit:
        at_least = "at least " if counted == limit + 1 else ""
        raise _validation(f"This model's maximum context length is {limit} tokens. However, your prompt contains "
                          f"{at_least}{counted} input tokens, which exceeds this limit even without any output "
                          f"tokens. Please reduce the length of the input prompt.", "input_tokens", counted)
    rest = limit - counted
    max_tokens = rest if requested is None else min(requested, rest)
    if max_tokens < 1:
        raise _validation(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens", max_tokens)
    if not ids:
        raise _validation("The decoder prompt cannot be empty")
    low, high = min(ids), max(ids)
    if low < 0 or high >= vocab_size:
        raise _validation(f"Token id {low if low < 0 else high} is out of vocabulary")
    return max_tokens


def unknown_model(name: str) -> ApiError:
    return ApiError(404, f"The model `{name}` does not exist.", "NotFoundError", "model")


# request bodies (unknown fields are ignored, as vLLM ignores them)

class _StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    stream: bool = False
    stream_options: _StreamOptions | None = None
    n: int = 1
    seed: int | None = None
    ignore_eos: bool = False
    max_tokens: int | None = None


class _CompletionBody(_Body):
    prompt: str | list[int] | list[str]
    max_tokens: int | None = 16


class _Part(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str = "text"
    text: str = ""


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str
    content: str | list[_Part] | None = None


class _ChatBody(_Body):
    messages: list[_Message]
    max_completion_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Generation:
    """One request for the engine, read from a body."""

    kind: Literal["completion", "chat"]
    model: str
    prompt: list[int]  # token ids
    max_tokens: int
    seed: int
    stream: bool
    include_usage: bool


def _fields(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "body"
        parts.append(f"{loc}: {e['msg']}")
    return "; ".join(parts)


def _validate(model: type[_Body], body: object) -> _Body:
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    try:
        req = model.model_validate(body)
    except ValidationError as e:
        raise ApiError(400, _fields(e)) from None
    if req.n != 1:
        raise ApiError(400, f"n must be 1 on this emulated engine, got {req.n}", param="n")
    if req.stream_options is not None and not req.stream:
        raise ApiError(400, "Stream options can only be defined when `stream=True`.", param="stream_options")
    return req


def _model(req: _Body, served: tuple[str, ...]) -> str:
    if req.model is None:
        return served[0]
    if req.model not in served:
        raise unknown_model(req.model)
    return req.model


def read_generation(kind: Literal["completion", "chat"], body: object, served: tuple[str, ...],
                    vocab_size: int, max_model_len: int) -> Generation:
    """A completions or chat body as the engine's request, its ``max_tokens`` fitted to the
    context; ApiError when it cannot be one."""
    if kind == "completion":
        req = _validate(_CompletionBody, body)
        model = _model(req, served)
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise ApiError(400, f"one prompt per request on this emulated engine, got {len(prompt)}",
                               param="prompt")
            prompt = prompt[0]
        text = isinstance(prompt, str)
        ids = encode(prompt, vocab_size) if text else list(prompt)
        requested, param = req.max_tokens, "max_tokens"
    else:
        req = _validate(_ChatBody, body)
        model = _model(req, served)
        if not req.messages:
            raise ApiError(400, "messages: a chat needs at least one message", param="messages")
        messages = [{"role": m.role, "content": m.content if isinstance(m.content, str) else
                     "".join(p.text for p in m.content or () if p.type == "text")} for m in req.messages]
        text, ids = True, encode(chat_prompt(messages), vocab_size)
        if req.max_completion_tokens is not None:
            requested, param = req.max_completion_tokens, "max_completion_tokens"
        else:
            requested, param = req.max_tokens, "max_tokens"
    counted = min(len(ids), max_model_len + 1) if text else len(ids)
    max_tokens = _fit(ids, counted, requested, param, vocab_size, max_model_len)
    seed = req.seed if req.seed is not None else default_seed(ids)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    return Generation(kind, model, ids, max_tokens, seed, req.stream, include_usage)


# answers

def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None) -> dict:
    """vLLM's ``UsageInfo``; ``prompt_tokens_details`` is null unless the server reports cached
    tokens (vLLM's ``--enable-prompt-tokens-details``), when ``cached_tokens`` is given."""
    details = None if cached_tokens is None else {"cached_tokens": cached_tokens}
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": details}


def response(gen: Generation, request_id: str, text: str, use: dict) -> dict:
    """A whole (non-streamed) completion."""
    if gen.kind == "completion":
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length", "stop_reason": None}
        obj = "text_completion"
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": text, "tool_calls": []},
                  "logprobs": None, "finish_reason": "length", "stop_reason": None}
        obj = "chat.completion"
    return {"id": request_id, "object": obj, "created": int(time.time()), "model": gen.model,
            "choices": [choice], "usage": use}


class ChunkWriter:
    """The SSE lines of one streamed answer. Everything but a token's text is fixed per request,
    so a chunk is the bytes before the text, the text as a JSON string, and the bytes after."""

    __slots__ = ("chat", "head", "tail", "last", "envelope")

    def __init__(self, gen: Generation, request_id: str) -> None:
        created = int(time.time())
        obj = "text_completion" if gen.kind == "completion" else "chat.completion.chunk"
        envelope = f'{{"id":{json.dumps(request_id)},"object":"{obj}","created":{created},"model":{json.dumps(gen.model)},'
        self.envelope = envelope
        self.chat = gen.kind == "chat"
        if not self.chat:
            self.head = (f'data: {envelope}"choices":[{{"index":0,"text":').encode()
            after = ',"logprobs":null,"finish_reason":{},"stop_reason":null}}]}}\n\n'
        else:
            self.head = (f'data: {envelope}"choices":[{{"index":0,"delta":{{"content":').encode()
            after = '}},"logprobs":null,"finish_reason":{}}}]}}\n\n'
        self.tail = after.format("null").encode()
        self.last = after.format('"length"').encode()

    def first(self) -> bytes | None:
        """What a chat stream sends before its first token: the assistant's role."""
        if not self.chat:
            return None
        return (f'data: {self.envelope}"choices":[{{"index":0,"delta":{{"role":"assistant","content":""}},'
                f'"logprobs":null,"finish_reason":null}}]}}\n\n').encode()

    def token(self, text: str, last: bool) -> bytes:
        return self.head + json.dumps(text).encode() + (self.last if last else self.tail)

    def usage(self, use: dict) -> bytes:
        """The last chunk, with the usage; its null fields left out, as vLLM leaves them out."""
        use = {k: v for k, v in use.items() if v is not None}
        return f'data: {self.envelope}"choices":[],"usage":{json.dumps(use)}}}\n\n'.encode()


DONE = b"data: [DONE]\n\n"
