"""How the front doors decode an infer request without holding the event loop.

Everything a request declares is checked against its model's signature before its data is
read (:mod:`gateway.precheck`): a request no model would take is refused in microseconds,
whatever its size. What remains is decoded here on the loop when it is small, else by a
worker process (:mod:`gateway.frontdoor.decodepool`):

- JSON: a request whose JSON passes :data:`INLINE_BYTES` (about a millisecond of Python's
  JSON decoder, which reads some 40 MiB of numbers a second) is decoded by a worker, and so
  is a compressed body that inflates past it;
- BYTES: a request declaring more than :data:`INLINE_ELEMENTS` BYTES elements has their
  length prefixes walked by a worker (a walk reads one element at a time, ~0.35 us each);
- binary tensors of fixed-size types, whatever their size, are sliced on the loop (no copy);
- gRPC: the raw contents are cut out of the serialized message (:func:`split_grpc`) and used
  where they lie, so protobuf parses only the rest (for 63 MiB of raw contents that is 44 ms
  of parsing and 50 ms of copying saved); a request whose inputs carry over
  :data:`INLINE_BYTES` of typed contents is parsed by a worker.

The HTTP door's answers go the other way through the same workers: one carrying more than
:data:`~gateway.frontdoor.encode.INLINE_VALUES` JSON values is encoded by a worker
(:mod:`gateway.frontdoor.encode`).

Measured on this project's 2-core machine (``bench/decode_lag.py``): Python's JSON decoder
(40 MiB/s), python-rapidjson (39 MiB/s; 129 MiB/s in its native number mode, which does not
round as Python does), ``numpy.fromstring`` (48 MiB/s): none makes 60 MiB a matter of
milliseconds, and a thread holds the GIL while it decodes, so large bodies go to a process.
"""

from __future__ import annotations

import math
import mmap
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from gateway.codec import (
    InferInput,
    RequestedOutput,
    Signature,
    Tensor,
    answered_outputs,
    assemble_http,
    check_grpc,
    encode_http_response,
    grpc_input,
    http_layout,
    parse_grpc_infer,
    parse_http_infer,
    split_http_body,
)
from gateway.errors import InvalidRequest
from gateway.frontdoor.decodepool import DecodePool, TooLarge, raise_answer
from gateway.frontdoor.encode import (
    INLINE_VALUES,
    Encoded,
    encode_off_loop,
    http_answer_op,
    json_values,
)
from gateway.precheck import bytes_elements, check_json_size, check_layout

INLINE_BYTES = 32 << 10  # JSON (or typed gRPC contents) decoded on the loop at most: under a millisecond
INLINE_ELEMENTS = 4096  # BYTES elements walked on the loop at most: about 1.5 ms


def inflate(body: bytes, encoding: str | None, max_bytes: int) -> bytes:
    """``body`` with its gzip/deflate Content-Encoding undone, refusing to inflate past
    ``max_bytes`` (a small compressed body must not become a huge one)."""
    enc = (encoding or "identity").strip().lower()
    if enc in ("", "identity"):
        return body
    if enc not in ("gzip", "deflate"):
        raise InvalidRequest(f"Content-Encoding {enc!r} is not supported (gzip, deflate)")
    d = zlib.decompressobj(16 + zlib.MAX_WBITS if enc == "gzip" else zlib.MAX_WBITS)
    try:
        out = d.decompress(body, max_bytes + 1)
    except zlib.error as e:
        raise InvalidRequest(f"unreadable request body: {enc} data is corrupt ({e})") from None
    if len(out) > max_bytes:
        raise TooLarge(f"request body exceeds {max_bytes} bytes once decoded")
    return out


@dataclass(slots=True)
class GrpcCall:
    """A ModelInferRequest as read on the loop (:func:`read_grpc`): ``req`` without its raw
    contents, which are ``raws`` (views of ``raw``); ``deferred``: its inputs too are left
    out of ``req``, to be parsed by a worker."""

    req: pb.ModelInferRequest
    raw: bytes | None  # None: only req is at hand (serialized again if a worker must parse it)
    raws: list[memoryview] | None  # None: the raw contents are in req (the message was parsed whole)
    deferred: bool = False


def read_grpc(raw: bytes, inline_bytes: int = INLINE_BYTES) -> GrpcCall:
    """The request in ``raw`` read as far as the loop reads it: everything but its raw
    contents (and its inputs, when they carry more than ``inline_bytes``)."""
    if len(raw) <= inline_bytes:  # small: protobuf parses it whole faster than it is split
        return GrpcCall(_parse(raw), raw, None)
    split = split_grpc(raw)
    if split is None:  # more fields than a request has, or bytes protobuf must judge
        return GrpcCall(_parse(raw), raw, None)
    if split.inputs_bytes > inline_bytes:
        light = split_grpc(raw, keep_inputs=False)
        if light is not None:  # the same walk as above
            return GrpcCall(_parse(light.head), raw, light.raws, deferred=True)
    return GrpcCall(_parse(split.head), raw, split.raws)


def _parse(raw: bytes) -> pb.ModelInferRequest:
    try:
        return pb.ModelInferRequest.FromString(raw)
    except DecodeError as e:
        raise InvalidRequest(f"malformed ModelInferRequest: {e}") from None


class Decoder:
    """Decodes infer requests for the front doors, and encodes the HTTP door's JSON answers
    (:mod:`gateway.frontdoor.encode`): on the loop when small, else by ``pool`` (whose jobs wait
    per client: ``client`` is the tenant, else the address). Each call answers now, or
    answers an awaitable."""

    def __init__(self, pool: DecodePool | None = None, inline_bytes: int = INLINE_BYTES,
                 inline_elements: int = INLINE_ELEMENTS, inline_values: int = INLINE_VALUES) -> None:
        self.pool = pool or DecodePool()
        self.inline_bytes = inline_bytes
        self.inline_elements = inline_elements
        self.inline_values = inline_values

    def http_answer(self, model: str, version: str, req: InferInput, outputs: list[Tensor],
                    parameters: dict[str, Any], client: str
                    ) -> Encoded | Awaitable[Encoded]:
        """The HTTP answer to ``req`` (:func:`~gateway.codec.encode_http_response`): encoded on
        the loop when it carries at most ``inline_values`` JSON values, else by a worker."""
        chosen = answered_outputs(req, outputs)
        if sum(json_values(t) for t, binary in chosen if not binary) <= self.inline_values:
            return encode_http_response(model, version, req, outputs, parameters)
        return encode_off_loop(self.pool, client, model, version, req.id, parameters, chosen)

    def http(self, body: bytes, header_length: str | None, encoding: str | None, max_body: int, max_depth: int,
             sig: Signature | None, model: str, client: str) -> InferInput | Awaitable[InferInput]:
        """An HTTP infer body (``encoding``: its Content-Encoding) for ``model`` of signature
        ``sig`` (None: not known yet)."""
        enc = (encoding or "identity").strip().lower()
        if enc not in ("", "identity"):
            plain = self._inflated_here(body, enc, max_body)
            if plain is None:
                return self._offload(client, "http", (header_length, max_depth, sig, model, enc, max_body), body)
            body = plain
        head, binary = split_http_body(body, header_length)
        if sig is not None:
            check_json_size(sig, model, len(head))
        if len(head) > self.inline_bytes:
            return self._offload(client, "http", (header_length, max_depth, sig, model, "", max_body), body)
        layout = http_layout(head, max_depth)
        if sig is not None:
            check_layout(sig, model, layout)
        if bytes_elements(t for t in layout.inputs if t.size is not None) > self.inline_elements:
            return self._offload(client, "http", (header_length, max_depth, sig, model, "", max_body), body)
        return assemble_http(layout, binary, sig)

    def _inflated_here(self, body: bytes, enc: str, max_body: int) -> bytes | None:
        """A compressed body inflated on the loop when it is small both ways, else None."""
        if len(body) > self.inline_bytes:
            return None
        try:
            out = inflate(body, enc, self.inline_bytes)
        except TooLarge:  # past what is inflated here: a worker's (which checks max_body)
            return None
        if len(out) > max_body:
            raise TooLarge(f"request body exceeds {max_body} bytes once decoded")
        return out

    def grpc(self, call: GrpcCall, sig: Signature | None, model: str,
             client: str) -> InferInput | Awaitable[InferInput]:
        """A gRPC infer request read by :func:`read_grpc`, for ``model`` of signature ``sig``."""
        raw = call.raw if call.raw is not None else call.req.SerializeToString
        if call.deferred:
            return self._offload(client, "grpc", (sig, model), raw)
        contents = call.req.raw_input_contents if call.raws is None else call.raws
        shapes, outputs = check_grpc(call.req, contents, sig, model)
        walk = sum(math.prod(s) for i, s in zip(call.req.inputs, shapes, strict=True) if i.datatype == "BYTES")
        if walk > self.inline_elements:
            return self._offload(client, "grpc", (sig, model), raw)
        return grpc_input(call.req, contents, shapes, outputs, sig)

    async def _offload(self, client: str, op: str, args: tuple, blob: bytes | Callable[[], bytes]) -> InferInput:
        if callable(blob):
            blob = blob()
        answer, out = await self.pool.run(client, op, args, blob)
        return _unpack(raise_answer(answer), blob, out)

    async def close(self) -> None:
        await self.pool.close()


# --------------------------------------------------------------------------- gRPC's wire format

_RAW_INPUT_CONTENTS = pb.ModelInferRequest.DESCRIPTOR.fields_by_name["raw_input_contents"].number
_INPUTS = pb.ModelInferRequest.DESCRIPTOR.fields_by_name["inputs"].number
_WIRE_SKIP = {1: 8, 5: 4}  # fixed64, fixed32: their bytes


@dataclass(slots=True)
class GrpcSplit:
    """A serialized ModelInferRequest cut in two: ``head``, its fields but the raw contents
    (and but its inputs, when cut with ``keep_inputs=False``), and ``raws``, each raw content
    a view of the message; ``inputs_bytes``: what its inputs weigh (typed contents included)."""

    head: bytes
    raws: list[memoryview]
    inputs_bytes: int


def split_grpc(raw: bytes, max_fields: int = 4096, keep_inputs: bool = True) -> GrpcSplit | None:
    """Walk the top-level fields of the serialized ModelInferRequest ``raw`` and cut out its
    raw_input_contents (and its inputs, unless ``keep_inputs``), so that parsing the rest costs
    what the request's metadata weighs, not its tensors (protobuf would copy each raw content
    twice: into the message, then into a ``bytes``). None past ``max_fields`` fields, or on
    bytes that are not a well-formed message (for protobuf to judge)."""
    view = memoryview(raw)
    end, i, fields, last, inputs_bytes = len(raw), 0, 0, 0, 0
    keep: list[memoryview] = []
    raws: list[memoryview] = []
    while i < end:
        fields += 1
        if fields > max_fields:
            return None
        start = i
        key, i = _varint(raw, i, end)
        if key is None:
            return None
        field, wire = key >> 3, key & 7
        body = i
        if wire == 2:
            n, body = _varint(raw, i, end)
            if n is None:
                return None
            i = body + n
        elif wire == 0:
            v, i = _varint(raw, i, end)
            if v is None:
                return None
        elif wire in _WIRE_SKIP:
            i += _WIRE_SKIP[wire]
        else:
            return None
        if i > end:
            return None
        if wire != 2 or field not in (_INPUTS, _RAW_INPUT_CONTENTS):
            continue
        if field == _INPUTS:
            inputs_bytes += i - start
            if keep_inputs:
                continue
        else:
            raws.append(view[body:i])
        keep.append(view[last:start])
        last = i
    if not keep:
        return GrpcSplit(raw, [], inputs_bytes)
    keep.append(view[last:end])
    return GrpcSplit(b"".join(keep), raws, inputs_bytes)


def _varint(buf: bytes, i: int, end: int) -> tuple[int | None, int]:
    value = shift = 0
    while i < end and shift < 64:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7
    return None, i


# --------------------------------------------------------------------------- the worker's side

_Packed = tuple[list[tuple[str, str, list[int], bool, int, int]], list[RequestedOutput], str, dict[str, Any]]


def _pack(inp: InferInput, blob: bytes) -> tuple[_Packed, list[bytes | memoryview]]:
    """``inp`` as a worker answers it: each tensor an offset into the request's ``blob`` where
    it was sliced from it (no copy back), else into the answer's blobs."""
    base = np.frombuffer(blob, np.uint8).ctypes.data if blob else 0
    tensors, parts, at = [], [], 0
    for t in inp.inputs:
        n = len(t.raw)
        if n and isinstance(t.raw, memoryview) and t.raw.obj is blob:
            tensors.append((t.name, t.datatype, t.shape, True, np.frombuffer(t.raw, np.uint8).ctypes.data - base, n))
            continue
        tensors.append((t.name, t.datatype, t.shape, False, at, n))
        parts.append(t.raw)
        at += n
    return (tensors, inp.outputs, inp.id, inp.parameters), parts


def _unpack(packed: _Packed, blob: bytes, out: mmap.mmap | bytearray) -> InferInput:
    tensors, outputs, rid, params = packed
    sent, got = memoryview(blob), memoryview(out)
    inputs = [Tensor(name, dt, shape, (sent if in_blob else got)[at : at + n])
              for name, dt, shape, in_blob, at, n in tensors]
    return InferInput(inputs, outputs, rid, params)


def _http_op(blob: bytes, header_length: str | None, max_depth: int, sig: Signature | None, model: str,
             encoding: str, max_body: int) -> tuple[_Packed, list[bytes | memoryview]]:
    body = inflate(blob, encoding, max_body) if encoding else blob
    return _pack(parse_http_infer(body, header_length, max_depth, sig, model), blob)


def _grpc_op(blob: bytes, sig: Signature | None, model: str) -> tuple[_Packed, list[bytes | memoryview]]:
    split = split_grpc(blob, max_fields=1 << 62)
    if split is None:
        return _pack(parse_grpc_infer(_parse(blob), None, sig, model), blob)
    return _pack(parse_grpc_infer(_parse(split.head), split.raws, sig, model), blob)


WORKER_OPS: dict[str, Callable[..., tuple[Any, list[bytes]] | tuple[_Packed, list[bytes | memoryview]]]] = {
    "http": _http_op, "grpc": _grpc_op, "http_answer": http_answer_op}
