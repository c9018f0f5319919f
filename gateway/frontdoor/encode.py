"""How the HTTP front door writes a large JSON answer without holding the event loop.

An answer carries each output binary or as JSON values (:func:`gateway.codec.answered_outputs`:
the output's ``binary_data``, else the request's ``binary_data_output``). Python's JSON encoder
writes a float through its ``repr``, one at a time: 0.8-1 us a value on this project's 2-core
machine (an integer 0.08 us), so an answer of 8 MiB of FP32 (2M values) held the loop 1.6-2 s,
and one of 60 MiB 16 s (``bench/encode_lag.py``).
An answer with more than :data:`INLINE_VALUES` JSON values is encoded by a decode worker
(:mod:`gateway.frontdoor.decodepool`: the same processes and the same per-client queue as large
requests), which runs the very encoder the loop runs for small answers
(:func:`gateway.codec.response_head`), so the bytes are the same; its binary outputs are never
sent to the worker (only their sizes), and are appended on the loop as before.

Whether an answer may need a worker is known before it comes (:func:`may_be_large`): from the
outputs the request wants as JSON and their bounds in the model's signature (a model without
one yet answers nothing: the driver refuses its requests). Only such
requests wait for their answer behind a future of their own (:func:`encoded_first`: a loop turn
more, and an answer that comes small after all is encoded on the loop there); every other
answer (binary outputs, or JSON outputs the signature bounds, such as a 1x16 FP32) is encoded on
the loop as before, in the callback that receives the driver's result.

The answer's JSON comes back from the worker in slices, into memory the HTTP server
writes from as it is (:class:`~gateway.frontdoor.httpmessage.HttpResponse` takes the mapping).
What still holds the loop for a large answer is its write: the server joins the answer's head
and body into one ``bytes`` (``HttpResponse.encode``), and Python 3.11's socket transport
copies what the socket does not take at once into its buffer; each copy costs about 0.8 ms a
MiB on this machine (fresh pages), some 90 ms for the 38 MiB of JSON of 8 MiB of FP32.
"""

from __future__ import annotations

import asyncio
import math
import mmap
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from gateway.codec import DTYPE_SIZE, InferInput, Signature, Tensor, response_head
from gateway.frontdoor.decodepool import DecodePool, raise_answer

INLINE_VALUES = 1024  # JSON values encoded on the loop at most: about a millisecond of floats

R = TypeVar("R")
Encoded = tuple[bytes | mmap.mmap, int | None]  # an answer's body, and its JSON header's length (None: all of it)

# each answered output as the worker gets it: name, datatype, shape, whether it goes binary, and
# its size in bytes (those going as JSON follow one another in the job's blob)
Layout = list[tuple[str, str, list[int], bool, int]]


def json_values(t: Tensor) -> int:
    """At most how many JSON values output ``t`` is written as (a BYTES element takes at least
    its 4-byte length prefix)."""
    return len(t.raw) // (DTYPE_SIZE.get(t.datatype) or 4)


def may_be_large(sig: Signature, req: InferInput, inline_values: int = INLINE_VALUES) -> bool:
    """Whether the answer to ``req`` may carry more than ``inline_values`` JSON values, as far as
    its model's signature ``sig`` bounds its outputs: an output wanted as JSON that the signature
    does not name, whose dims have a -1, or BYTES (whose strings have no bound), or whose values
    for the request's rows are too many."""
    default_binary = bool(req.parameters.get("binary_data_output", False))
    if req.outputs:
        names = []  # (a loop, not a comprehension: this runs for every request)
        for o in req.outputs:
            if not (default_binary if o.binary is None else o.binary):
                names.append(o.name)
        if not names:
            return False
    elif default_binary:
        return False
    else:
        names = None  # all of them
    shape = req.inputs[0].shape if req.inputs else None
    rows = max(1, shape[0]) if sig.max_batch_size > 0 and shape else 1
    values = 0
    for name in sig.outputs if names is None else names:
        ts = sig.outputs.get(name)
        if ts is None or ts.datatype == "BYTES" or -1 in ts.dims:
            return True
        values += rows * math.prod(ts.dims)
    return values > inline_values


def encoded_first(result: asyncio.Future[R], encode: Callable[[R], Encoded | Awaitable[Encoded]],
                  into: list[Encoded]) -> asyncio.Future[R]:
    """A future of ``result``'s outcome, done once ``encode(result)`` is done too (its answer
    appended to ``into``): in ``result``'s own callback when ``encode`` answers at once, else
    when its awaitable does (an error of either is the future's). No task unless ``encode``
    needs one; cancelling the future cancels ``result`` and the encoding."""
    outer: asyncio.Future[R] = result.get_loop().create_future()

    def got(f: asyncio.Future[R]) -> None:
        if outer.done():
            return
        if f.cancelled():
            outer.cancel()
            return
        e = f.exception()
        if e is not None:
            outer.set_exception(e)
            return
        res = f.result()
        try:
            body = encode(res)
        except Exception as err:  # noqa: BLE001  (the answer's error, as the result's would be)
            outer.set_exception(err)
            return
        if isinstance(body, tuple):
            into.append(body)
            outer.set_result(res)
            return
        job = asyncio.ensure_future(body)
        job.add_done_callback(lambda j: _encoded(outer, j, res, into))
        outer.add_done_callback(lambda o: o.cancelled() and job.cancel())

    result.add_done_callback(got)
    outer.add_done_callback(lambda o: o.cancelled() and result.cancel())
    return outer


def _encoded(outer: asyncio.Future[R], job: asyncio.Future[Encoded], res: R, into: list[Encoded]) -> None:
    if outer.done():
        return
    if job.cancelled():
        outer.cancel()
    elif (e := job.exception()) is not None:
        outer.set_exception(e)
    else:
        into.append(job.result())
        outer.set_result(res)


def answer_layout(chosen: list[tuple[Tensor, bool]]) -> tuple[Layout, list[bytes | memoryview]]:
    """The answer's outputs as a worker encodes them, and the bytes of those it writes as JSON."""
    layout: Layout = [(t.name, t.datatype, t.shape, binary, len(t.raw)) for t, binary in chosen]
    return layout, [t.raw for t, binary in chosen if not binary]


async def encode_off_loop(pool: DecodePool, client: str, model: str, version: str, rid: str,
                          parameters: dict[str, Any], chosen: list[tuple[Tensor, bool]]) -> Encoded:
    """The answer's body and JSON header length (None: no binary output), as
    :func:`gateway.codec.encode_http_response` writes it, its JSON written by a worker of
    ``pool`` (queued for ``client``). An answer without binary outputs is the memory the
    worker's answer was read into: copying it into a ``bytes`` would hold the loop (~0.8 ms a
    MiB on this project's machine, its pages fresh)."""
    layout, values = answer_layout(chosen)
    answer, head = await pool.run(client, "http_answer", (model, version, rid, parameters, layout), values)
    raise_answer(answer)
    blobs = [t.raw for t, binary in chosen if binary]
    if not blobs:
        return head if isinstance(head, mmap.mmap) else bytes(head), None
    return b"".join([head, *blobs]), len(head)


def http_answer_op(blob: bytes, model: str, version: str, rid: str, parameters: dict[str, Any],
                   layout: Layout) -> tuple[None, list[bytes]]:
    """The worker's side: the answer's JSON, the JSON outputs' bytes read from ``blob``."""
    view, at = memoryview(blob), 0
    outputs: list[tuple[Tensor, int | None]] = []
    for name, datatype, shape, binary, nbytes in layout:
        if binary:
            outputs.append((Tensor(name, datatype, shape, b""), nbytes))
            continue
        outputs.append((Tensor(name, datatype, shape, view[at : at + nbytes]), None))
        at += nbytes
    return None, [response_head(model, version, rid, parameters, outputs)]
