"""Triton python-backend model of the emulated LLM engine, decoupled (copied into a repository as
``model.py`` by :func:`profiles.emulator.llm_repository.write_llm_model`).

One :class:`~profiles.llm.engine.Engine` per model instance runs on a thread of its own, driven by
:class:`~profiles.llm.loop.EngineLoop` against ``time.monotonic()``: the thread sleeps until
``loop.wake`` or a new request, polls, and queues each sampled token for its request. ``execute``
only checks each request and adds it to the engine; a second thread sends the responses, so a
slow send delays delivery, never the engine.

A request speaks as it does to Triton's vLLM and TensorRT-LLM backends: ``text_input``, and
``max_tokens``, ``stream``, ``seed``, ``ignore_eos``, ``exclude_input_in_output`` as tensors or,
failing that, request parameters (the ``parameters`` of Triton's generate extension). The prompt
is tokenized by :mod:`profiles.llm.tokens`; without a seed, the seed is the CRC-32 of the prompt's
token ids, as the emulated OpenAI server takes it, so both give the same text. The emulated engine
never samples an end of sequence, so a request always gets its ``max_tokens`` and ``ignore_eos``
changes nothing.

Answers:
- streaming: one response per token, ``text_output`` that token's text, the last one flagged
  ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``;
- otherwise one final response with the whole text, the prompt first unless
  ``exclude_input_in_output`` (as vLLM's backend answers);
- a request the engine refuses (a prompt and ``max_tokens`` past the context: the engine's
  :class:`~profiles.llm.engine.RequestTooLong` message; no prompt; ``max_tokens`` below 1) gets one
  final error response, INVALID_ARG.

A request the client cancels (``response_sender.is_cancelled()``, or a send that fails) is aborted
in the engine, its KV blocks freed, and ends with a CANCELLED error. Triton's ``/metrics`` carries
the engine's state under vLLM's names, labelled ``model`` and ``version``:
``vllm:num_requests_running`` / ``_waiting``, ``vllm:kv_cache_usage_perc`` (a fraction),
``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``, ``vllm:num_preemptions_total``,
``vllm:prefix_cache_queries_total`` / ``_hits_total`` (tokens) and ``vllm:request_success_total``
by ``finished_reason`` (``length``, ``abort``).
"""

import itertools
import json
import queue
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
CHECK_S = 0.05  # how often requests that get no response meanwhile are asked whether they were cancelled
METRICS_S = 0.05  # how often the engine's metrics are reported while it works (and whenever it goes idle)


class _Live:
    """One request in the engine, as its driver sees it."""

    __slots__ = ("id", "sender", "stream", "prefix", "tokens", "final")

    def __init__(self, rid, sender, stream, prefix):
        self.id = rid
        self.sender = sender
        self.stream = stream
        self.prefix = prefix  # text before the generated text in a whole answer
        self.tokens = []
        self.final = False  # its final response is queued: nothing more is sent or checked


class _Metrics:
    """The engine's series (profiles/llm/metrics.py) as Triton custom metrics: gauges set,
    counters raised by what they gained since the last report."""

    def __init__(self, labels, first):
        gauge, counter = pb_utils.MetricFamily.GAUGE, pb_utils.MetricFamily.COUNTER
        # the families live as long as their metrics: a metric whose family is gone cannot be set
        self.families = {}
        self.metrics = []
        for x in first:
            name = x.name + "_total" if x.counter else x.name
            if name not in self.families:
                self.families[name] = pb_utils.MetricFamily(name=name, description=x.doc,
                                                             kind=counter if x.counter else gauge)
            self.metrics.append((self.families[name].Metric(labels={**labels, **dict(x.labels)}), x.counter))
        self.last = [None] * len(self.metrics)

    def report(self, values):
        for i, ((metric, counter), value, before) in enumerate(zip(self.metrics, values, self.last, strict=True)):
            if not counter and value != before:
                metric.set(value)
            elif counter and value > (before or 0):
                metric.increment(value - (before or 0))
            self.last[i] = value


def _error(message, code):
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message=message, code=code))


def _text_response(text):
    return pb_utils.InferenceResponse([pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_))])


class TritonPythonModel:
    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in cfg.get("parameters", {}).items()}
        root = params.get("headrace_root", "")
        if root and root not in sys.path:
            sys.path.insert(0, root)
        from profiles.emulator.llm_repository import PROFILE_FILE, engine_config_from_params
        from profiles.llm.engine import Engine, LlmRequest
        from profiles.llm.loop import EngineLoop
        from profiles.llm.metrics import samples
        from profiles.llm.profile import load_llm_profiles
        from profiles.llm.tokens import decode, default_seed, encode

        if not pb_utils.using_decoupled_model_transaction_policy(cfg):
            raise pb_utils.TritonModelException("the emulated LLM engine needs model_transaction_policy "
                                                "{ decoupled: true }")
        self.LlmRequest, self.encode, self.decode, self.default_seed = LlmRequest, encode, decode, default_seed
        self.samples = samples
        profile = load_llm_profiles(Path(__file__).parent / PROFILE_FILE)[0]
        self.engine = Engine(engine_config_from_params(params), profile.step_time)
        self.loop = EngineLoop(self.engine, profile.frontend_s)
        self.vocab = self.engine.config.vocab_size
        self.default_max_tokens = int(params.get("default_max_tokens", "16"))
        self.logger = pb_utils.Logger
        self.ids = itertools.count()
        self.cv = threading.Condition()
        self.live = {}  # request id -> _Live, while it is in the engine
        self.cancelled = set()  # ids the sender found cancelled, for the driver to abort
        self.stopping = False
        self.broken = None  # why the engine stopped, once it has
        try:
            self.metrics = _Metrics({"model": args["model_name"], "version": args["model_version"]},
                                    samples(self.engine))
        except pb_utils.TritonModelException as e:  # the server runs without metrics
            self.logger.log_info(f"emulated LLM engine: no metrics ({e})")
            self.metrics = None
        self.outbox = queue.SimpleQueue()  # ("send", live, response, flags) | ("check", live) | ("metrics", snap)
        self.sender_thread = threading.Thread(target=self._send_loop, name="llm-sender", daemon=True)
        self.driver_thread = threading.Thread(target=self._drive, name="llm-engine", daemon=True)
        self.sender_thread.start()
        self.driver_thread.start()

    # requests in

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                live, req = self._parse(request, sender)
                with self.cv:
                    broken = self.broken
                    if broken is None:
                        # RequestTooLong or ValueError when the engine refuses it
                        self.loop.add(req, time.monotonic())
                        self.live[req.id] = live
                        self.cv.notify()
            except ValueError as e:
                sender.send(_error(str(e), pb_utils.TritonError.INVALID_ARG), flags=FINAL)
                continue
            if broken is not None:
                sender.send(_error(broken, pb_utils.TritonError.INTERNAL), flags=FINAL)
        return None

    def _parse(self, request, sender):
        try:
            extra = json.loads(request.parameters() or "{}")
        except json.JSONDecodeError:
            extra = {}

        def value(name, kind, default):
            t = pb_utils.get_input_tensor_by_name(request, name)
            if t is not None:
                return kind(t.as_numpy().reshape(-1)[0])
            if name not in extra:
                return default
            v = extra[name]
            if isinstance(v, bool) != (kind is bool) or not isinstance(v, kind):
                raise ValueError(f"parameter {name!r} must be {'a boolean' if kind is bool else 'an integer'}, "
                                 f"got {v!r}")
            return v

        raw = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
        try:
            prompt = raw.decode() if isinstance(raw, bytes) else str(raw)
        except UnicodeDecodeError:
            raise ValueError("text_input must be UTF-8 text") from None
        max_tokens = value("max_tokens", int, self.default_max_tokens)
        stream = value("stream", bool, False)
        value("ignore_eos", bool, False)  # checked; the emulated engine never samples an end of sequence
        exclude = value("exclude_input_in_output", bool, False)
        ids = self.encode(prompt, self.vocab)
        seed = value("seed", int, None)
        if seed is None:
            seed = self.default_seed(ids)
        elif seed < 0:
            raise ValueError(f"seed must be at least 0, got {seed}")
        rid = f"{next(self.ids)}"
        prefix = "" if stream or exclude else prompt
        return _Live(rid, sender, stream, prefix), self.LlmRequest(rid, ids, max_tokens, seed)

    # the engine's driver

    def _drive(self):
        loop, engine = self.loop, self.engine
        next_check = next_report = 0.0
        with self.cv:
            try:
                while not self.stopping:
                    for rid in self.cancelled:
                        live = self.live.pop(rid, None)
                        if live is not None and loop.abort(rid):
                            self._queue_final(live, _error("Request was cancelled", pb_utils.TritonError.CANCELLED))
                    self.cancelled.clear()
                    now = time.monotonic()
                    out = loop.poll(now)
                    if out is not None:
                        self._deliver(out)
                    if self.live and now >= next_check:
                        next_check = now + CHECK_S
                        for live in self.live.values():
                            if not (live.stream and live.tokens):  # a streamed request is checked as it is sent
                                self.outbox.put(("check", live))
                    if self.metrics is not None and (now >= next_report or engine.idle):
                        next_report = now + METRICS_S
                        self.outbox.put(("metrics", [x.value for x in self.samples(engine)]))
                    wake = loop.wake
                    if wake is None:
                        timeout = CHECK_S if self.live else None  # requests that cannot start still get checked
                    else:
                        timeout = wake - time.monotonic()
                    if timeout is None or timeout > 0:
                        self.cv.wait(timeout)
            except Exception:  # a fault in the engine fails every request rather than hanging it
                self.broken = "the emulated LLM engine failed"
                self.logger.log_error(f"emulated LLM engine failed: {traceback.format_exc()}")
                self._fail_all(self.broken, pb_utils.TritonError.INTERNAL)

    def _deliver(self, out):
        live, decode, finished = self.live, self.decode, set(out.finished)
        for rid, tok in out.tokens:  # a finishing request's last token is among them
            s = live.get(rid)
            if s is None:
                continue
            s.tokens.append(tok)
            if rid in finished:
                del live[rid]
                self._queue_final(s, _text_response(decode((tok,)) if s.stream else s.prefix + decode(s.tokens)))
            elif s.stream:
                self.outbox.put(("send", s, _text_response(decode((tok,))), 0))

    def _queue_final(self, live, response):
        live.final = True
        self.outbox.put(("send", live, response, FINAL))

    def _fail_all(self, message, code):
        for live in self.live.values():
            self._queue_final(live, _error(message, code))
        self.live.clear()

    # responses out

    def _send_loop(self):
        while (item := self.outbox.get()) is not None:
            if item[0] == "metrics":
                try:
                    self.metrics.report(item[1])
                except Exception as e:
                    self.logger.log_error(f"emulated LLM engine: metrics: {e}")
                continue
            live = item[1]
            try:
                if item[0] == "send":
                    live.sender.send(item[2], flags=item[3])
                if not live.final and live.sender.is_cancelled():
                    self._cancel(live)
            except Exception as e:  # a send that fails: the client has gone
                self.logger.log_info(f"emulated LLM engine: request {live.id}: {e}")
                if not live.final:
                    self._cancel(live)

    def _cancel(self, live):
        with self.cv:
            if live.id in self.live:
                self.cancelled.add(live.id)
                self.cv.notify()

    def finalize(self):
        with self.cv:
            self.stopping = True
            self.cv.notify()
        self.driver_thread.join(10)
        with self.cv:
            self._fail_all("the emulated LLM engine is shutting down", pb_utils.TritonError.UNAVAILABLE)
        self.outbox.put(None)
        self.sender_thread.join(10)
