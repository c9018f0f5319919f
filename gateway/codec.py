"""Tensors on the wire: KServe v2 JSON, the binary tensor extension and gRPC raw contents.

Inside the gateway a tensor is its name, datatype, shape and little-endian row-major bytes
(:class:`Tensor`). Batching is byte concatenation along the batch dimension and splitting is
slicing, so a request's data is never converted to numbers unless it came in (or must go
out) as JSON. Every decoding error raises :class:`~gateway.errors.InvalidRequest` naming the
tensor and the offending value. A JSON request is refused (before it is parsed) when it nests
deeper than ``limits.max_json_depth``, and float tensors refuse NaN and infinities. An input
naming a shared-memory region (:data:`SHM_PARAMS`) is refused: the gateway does not offer
Triton's shared-memory extension.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from gateway.errors import InvalidRequest
from gateway.precheck import check_bytes_room, check_json_size, check_layout, check_signature
from gateway.tensors import (  # noqa: F401  (the codec's API: its callers import them from here)
    InferInput,
    RequestedOutput,
    RequestLayout,
    Signature,
    Tensor,
    TensorLayout,
    TensorSig,
)
from profiles.schema import LimitsSpec

# bytes per element; BYTES elements are length-prefixed (4-byte little-endian) strings
DTYPE_SIZE: dict[str, int] = {
    "BOOL": 1, "UINT8": 1, "UINT16": 2, "UINT32": 4, "UINT64": 8,
    "INT8": 1, "INT16": 2, "INT32": 4, "INT64": 8,
    "FP16": 2, "FP32": 4, "FP64": 8, "BF16": 2, "BYTES": 0,
}
NP_DTYPE: dict[str, str] = {
    "BOOL": "?", "UINT8": "<u1", "UINT16": "<u2", "UINT32": "<u4", "UINT64": "<u8",
    "INT8": "<i1", "INT16": "<i2", "INT32": "<i4", "INT64": "<i8",
    "FP16": "<f2", "FP32": "<f4", "FP64": "<f8",
}
# InferTensorContents field holding each datatype in gRPC requests that do not use raw contents
_GRPC_CONTENTS: dict[str, str] = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
    "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
    "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}
_LEN = struct.Struct("<I")
_FLOATS = frozenset({"FP16", "FP32", "FP64"})  # JSON float data must be finite
# Triton's shared-memory extension's tensor parameters: not offered, refused wherever they appear
SHM_PARAMS = frozenset({"shared_memory_region", "shared_memory_byte_size", "shared_memory_offset"})


def refuse_shm(name: str, params: Any) -> None:
    """:class:`InvalidRequest` when input ``name``'s ``params`` name a shared-memory region."""
    for k in SHM_PARAMS:
        if k in params:
            raise InvalidRequest(f"input '{name}': parameter {k!r}: shared memory is not offered by this server")


# --------------------------------------------------------------------------- shapes and bytes


def _element_count(shape: list[int]) -> int:
    return math.prod(shape)


def check_size(t: Tensor) -> None:
    """The byte length must match the shape (fixed-size types) or parse (BYTES)."""
    if DTYPE_SIZE[t.datatype]:
        _check_length(t.name, t.datatype, t.shape, len(t.raw))
        return
    n = _element_count(t.shape)
    if _bytes_elements(t.raw, t.name, n) != n:
        raise InvalidRequest(f"input '{t.name}': BYTES data does not hold {n} elements for shape {t.shape}")


def _check_length(name: str, datatype: str, shape: list[int], nbytes: int) -> None:
    """A fixed-size datatype's byte length must match its shape."""
    want = _element_count(shape) * DTYPE_SIZE[datatype]
    if nbytes != want:
        raise InvalidRequest(
            f"input '{name}': {nbytes} bytes do not match shape {shape} of {datatype} ({want} bytes expected)"
        )


def _bytes_elements(raw: bytes | memoryview, name: str, most: int | None = None) -> int:
    """How many length-prefixed elements ``raw`` holds; past ``most`` the walk stops (at
    ``most + 1``), so its work is bounded by the count the shape declares."""
    off, count, end = 0, 0, len(raw)
    stop = end if most is None else most
    while off < end:
        if count > stop:
            return count
        if off + 4 > end:
            raise InvalidRequest(f"input '{name}': truncated BYTES element length at offset {off}")
        (n,) = _LEN.unpack_from(raw, off)
        off += 4 + n
        count += 1
    if off != end:
        raise InvalidRequest(f"input '{name}': BYTES element overruns the data")
    return count


def _bytes_offsets(raw: bytes | memoryview) -> list[int]:
    """Start offset of every BYTES element, plus the end."""
    out, off, end = [], 0, len(raw)
    while off < end:
        out.append(off)
        off += 4 + _LEN.unpack_from(raw, off)[0]
    out.append(end)
    return out


def concat(parts: list[Tensor]) -> Tensor:
    """One tensor holding ``parts`` stacked along the batch dimension."""
    first = parts[0]
    if len(parts) == 1:
        return first
    rows = sum(p.shape[0] for p in parts)
    return Tensor(first.name, first.datatype, [rows, *first.shape[1:]], b"".join(p.raw for p in parts))


def split(t: Tensor, rows: list[int]) -> list[Tensor]:
    """Cut ``t`` along the batch dimension into pieces of ``rows`` rows each."""
    if len(rows) == 1:
        return [t]
    view = memoryview(t.raw) if not isinstance(t.raw, memoryview) else t.raw
    per_row = _element_count(t.shape[1:])
    size = DTYPE_SIZE[t.datatype]
    out: list[Tensor] = []
    if size:
        stride, off = per_row * size, 0
        for r in rows:
            out.append(Tensor(t.name, t.datatype, [r, *t.shape[1:]], view[off : off + r * stride]))
            off += r * stride
        return out
    offsets, i = _bytes_offsets(view), 0
    for r in rows:
        j = i + r * per_row
        out.append(Tensor(t.name, t.datatype, [r, *t.shape[1:]], view[offsets[i] : offsets[j]]))
        i = j
    return out


# --------------------------------------------------------------------------- JSON <-> bytes


def _flatten(data: Any) -> list:
    if isinstance(data, list) and data and isinstance(data[0], list):
        out: list = []
        for d in data:
            out.extend(_flatten(d))
        return out
    return data if isinstance(data, list) else [data]


def json_to_raw(name: str, datatype: str, shape: list[int], data: Any) -> bytes:
    if data is None:
        raise InvalidRequest(f"input '{name}': needs 'data' or parameters.binary_data_size")
    if datatype == "BYTES":
        out = bytearray()
        for el in _flatten(data):
            if isinstance(el, str):
                b = el.encode()
            elif isinstance(el, (int, float, bool)):
                b = str(el).encode()
            else:
                raise InvalidRequest(f"input '{name}': BYTES element {el!r} is not a string")
            out += _LEN.pack(len(b)) + b
        return bytes(out)
    if datatype not in NP_DTYPE:
        raise InvalidRequest(f"input '{name}': datatype {datatype} cannot be sent as JSON; use binary data")
    flat = _flatten(data)
    for el in flat[:1]:  # cheap type guard; numpy checks the rest
        if isinstance(el, (str, dict, list)) or el is None:
            raise InvalidRequest(f"input '{name}': element {el!r} is not a {datatype} value")
    try:
        want = np.dtype(NP_DTYPE[datatype])
        if want.kind in "iu":  # integers: refuse fractions and out-of-range values, never wrap
            loose = np.asarray(flat)
            if loose.dtype.kind not in "iub" or (
                loose.size and (int(loose.min()) < np.iinfo(want).min or int(loose.max()) > np.iinfo(want).max)
            ):
                raise ValueError(f"values must be integers in [{np.iinfo(want).min}, {np.iinfo(want).max}]")
        with np.errstate(over="ignore"):  # a float past the type's range becomes inf (see _check_finite)
            arr = np.asarray(flat, dtype=want)
    except (ValueError, TypeError, OverflowError) as e:
        raise InvalidRequest(f"input '{name}': data is not {datatype}: {e}") from None
    if arr.ndim != 1 or arr.size != _element_count(shape):
        raise InvalidRequest(
            f"input '{name}': {arr.size if arr.ndim == 1 else 'ragged'} elements do not match "
            f"shape {shape} ({_element_count(shape)} expected)"
        )
    return arr.tobytes()


def _check_finite(name: str, datatype: str, raw: bytes, data: Any) -> None:
    """Float data sent as JSON must be finite: Python's JSON reads NaN, Infinity and 1e400
    (as inf), and a value past FP16/FP32's range becomes inf; Triton refuses them all."""
    arr = np.frombuffer(raw, dtype=NP_DTYPE[datatype])
    finite = np.isfinite(arr)
    if not finite.all():
        i = int(np.argmin(finite))
        raise InvalidRequest(f"input '{name}': element {i} is {_flatten(data)[i]!r}, not a finite {datatype} "
                             f"value (NaN, Infinity and numbers past {datatype}'s range are refused)")


def raw_to_json(t: Tensor) -> list:
    if t.datatype == "BYTES":
        offsets = _bytes_offsets(t.raw)
        raw = bytes(t.raw)
        out = []
        for a, b in zip(offsets, offsets[1:], strict=False):
            s = raw[a + 4 : b]
            try:
                out.append(s.decode())
            except UnicodeDecodeError:
                out.append(s.decode("latin-1"))
        return out
    if t.datatype not in NP_DTYPE:
        raise InvalidRequest(f"output '{t.name}': datatype {t.datatype} needs binary_data output")
    return np.frombuffer(t.raw, dtype=NP_DTYPE[t.datatype]).tolist()


# --------------------------------------------------------------------------- HTTP


def _shape(name: str, shape: Any) -> list[int]:
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise InvalidRequest(f"input '{name}': shape {shape!r} must be a list of non-negative integers")
    return shape


class Memo:
    """What a pure function of a hashable key returned for recent keys. Clients repeat a few
    header layouts (same tensors, shapes and options, new bytes), so most requests skip a
    JSON decode or encode. A stream of distinct keys only refills it: it is cleared when
    full, which keeps hits free of any LRU bookkeeping. Values are shared: read-only.
    Byte-string keys longer than ``max_key_bytes`` are not kept: those are documents with
    their data inline, each one seen once, and keeping them would hold their memory."""

    __slots__ = ("_d", "size", "max_key_bytes")

    def __init__(self, size: int = 256, max_key_bytes: int = 4096) -> None:
        self._d: dict[Any, Any] = {}
        self.size = size
        self.max_key_bytes = max_key_bytes

    def get(self, key: Any, make: Callable[[Any], Any] | None = None) -> Any:
        """The value for ``key``; on a miss ``make(key)``, remembered (None without ``make``)."""
        value = self._d.get(key)
        if value is None and make is not None:
            value = self.put(key, make(key))
        return value

    def put(self, key: Any, value: Any) -> Any:
        """Remember ``value`` for ``key`` (unless the key is too long to keep); returns it."""
        if isinstance(key, bytes) and len(key) > self.max_key_bytes:
            return value
        if len(self._d) >= self.size:
            self._d.clear()
        self._d[key] = value
        return value


_REQUEST_LAYOUTS = Memo()
MAX_JSON_DEPTH: int = LimitsSpec.model_fields["max_json_depth"].default
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.S)  # to its closing quote, or the end
_NESTING_STEP = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # +1 / -1 as int8
_NOT_NESTING = bytes(sorted(set(range(256)) - set(b"[]{}")))
_DEPTH_BLOCK = 1 << 20


def too_deep(doc: bytes, limit: int) -> bool:
    """Whether the JSON ``doc`` nests arrays and objects deeper than ``limit``, found without
    parsing it (no recursion, no Python loop per byte): brackets inside strings do not count.
    A document with at most ``limit`` opening brackets is answered by one pass of ``translate``."""
    marks = doc.translate(_NESTING_STEP, _NOT_NESTING)
    if marks.count(1) <= limit:
        return False
    if b'"' in doc:
        marks = _JSON_STRING.sub(b"", doc).translate(_NESTING_STEP, _NOT_NESTING)
    steps = np.frombuffer(marks, np.int8)
    level = 0
    for i in range(0, len(steps), _DEPTH_BLOCK):
        run = steps[i : i + _DEPTH_BLOCK].cumsum(dtype=np.int64) + level
        if int(run.max()) > limit:
            return True
        level = int(run[-1])
    return False


def _too_deep_error(limit: int) -> InvalidRequest:
    return InvalidRequest(f"JSON request nests deeper than limits.max_json_depth ({limit})")


def parse_http_infer(body: bytes, header_length: str | None, max_depth: int = MAX_JSON_DEPTH,
                     sig: Signature | None = None, model: str = "") -> InferInput:
    """Decode a KServe v2 infer body (JSON, or JSON + binary tensors when
    ``Inference-Header-Content-Length`` is given). The JSON header is decoded once per
    distinct header (:class:`Memo`); the binary part is sliced per request. JSON nested
    deeper than ``max_depth`` is refused before it is decoded. Given model ``model``'s
    signature ``sig``, JSON larger than any valid request could be is refused before it is
    parsed (:func:`check_json_size`), and the tensors the header declares are checked against
    it (:func:`check_layout`) before their binary data is read."""
    head, binary = split_http_body(body, header_length)
    if sig is not None:
        check_json_size(sig, model, len(head))
    layout = http_layout(head, max_depth)
    if sig is not None:
        check_layout(sig, model, layout)
    return assemble_http(layout, binary, sig)


def split_http_body(body: bytes, header_length: str | None) -> tuple[bytes, memoryview]:
    """An infer body's JSON and its binary part (empty without ``header_length``)."""
    binary: memoryview = memoryview(b"")
    if header_length is not None:
        try:
            hl = int(header_length)
        except ValueError:
            raise InvalidRequest(f"Inference-Header-Content-Length {header_length!r} is not an integer") from None
        if not 0 < hl <= len(body):
            raise InvalidRequest(
                f"Inference-Header-Content-Length ({hl}) must be in 1..{len(body)} (the body length)"
            )
        binary = memoryview(body)[hl:]
        body = body[:hl]
    return body, binary


def http_layout(head: bytes, max_depth: int = MAX_JSON_DEPTH) -> RequestLayout:
    """What an infer request's JSON says (its JSON data decoded): once per distinct header
    (:class:`Memo`)."""
    layout = _REQUEST_LAYOUTS.get(head)
    if layout is None:
        layout = _REQUEST_LAYOUTS.put(head, _request_layout(head, max_depth))
    elif max_depth < layout.depth_checked and too_deep(head, max_depth):  # remembered under a looser limit
        raise _too_deep_error(max_depth)
    return layout


def assemble_http(layout: RequestLayout, binary: memoryview, checked: Signature | None = None) -> InferInput:
    """The request ``layout`` describes, its binary tensors sliced from ``binary``; ``checked``:
    the signature ``layout`` was checked against (:func:`check_layout`), which the driver then
    does not check again."""
    out: list[Tensor] = []
    offset = 0
    for inp in layout.inputs:
        if inp.size is None:
            out.append(Tensor(inp.name, inp.datatype, inp.shape, inp.raw))  # type: ignore[arg-type]
            continue
        if offset + inp.size > len(binary):
            raise InvalidRequest(
                f"input '{inp.name}': binary_data_size ({inp.size}) runs past the body "
                f"({len(binary) - offset} binary bytes left)"
            )
        t = Tensor(inp.name, inp.datatype, inp.shape, binary[offset : offset + inp.size])
        offset += inp.size
        if inp.datatype == "BYTES":  # fixed-size types were checked with the layout
            check_size(t)
        out.append(t)
    if offset != len(binary):
        raise InvalidRequest(f"{len(binary) - offset} bytes of binary data are not claimed by any input")
    return InferInput(out, layout.outputs, layout.id, layout.parameters, checked,
                      _rows(checked, layout.inputs[0].shape) if checked is not None else 1)


def _request_layout(head: bytes, max_depth: int) -> RequestLayout:
    if too_deep(head, max_depth):
        raise _too_deep_error(max_depth)
    try:
        return _layout_of(head, max_depth)
    except RecursionError:  # a max_json_depth past what Python's recursion allows
        raise InvalidRequest(f"JSON request nests too deeply to decode (limits.max_json_depth is "
                             f"{max_depth})") from None


def _layout_of(head: bytes, max_depth: int) -> RequestLayout:
    try:
        doc = json.loads(head)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidRequest(f"malformed JSON request: {e}") from None
    if not isinstance(doc, dict):
        raise InvalidRequest(f"request must be a JSON object, got {type(doc).__name__}")
    inputs = doc.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise InvalidRequest("request needs a non-empty 'inputs' list")
    out: list[TensorLayout] = []
    for i, inp in enumerate(inputs):
        if not isinstance(inp, dict) or not isinstance(inp.get("name"), str):
            raise InvalidRequest(f"inputs[{i}] must be an object with a string 'name'")
        name = inp["name"]
        dt = inp.get("datatype")
        if dt not in DTYPE_SIZE:
            raise InvalidRequest(f"input '{name}': unknown datatype {dt!r}; known: {sorted(DTYPE_SIZE)}")
        shape = _shape(name, inp.get("shape"))
        params = inp.get("parameters") or {}
        if not isinstance(params, dict):
            raise InvalidRequest(f"input '{name}': parameters must be an object")
        if params:
            refuse_shm(name, params)
        bds = params.get("binary_data_size")
        if bds is not None:
            if not isinstance(bds, int) or isinstance(bds, bool) or bds < 0:
                raise InvalidRequest(f"input '{name}': binary_data_size {bds!r} must be a non-negative integer")
            if dt != "BYTES":  # BYTES data is checked per request: its content says
                _check_length(name, dt, shape, bds)
            out.append(TensorLayout(name, dt, shape, bds, None))
        else:
            raw = json_to_raw(name, dt, shape, inp.get("data"))
            check_size(Tensor(name, dt, shape, raw))
            if dt in _FLOATS:
                _check_finite(name, dt, raw, inp.get("data"))
            out.append(TensorLayout(name, dt, shape, None, raw))
    outputs = []
    for i, o in enumerate(doc.get("outputs") or []):
        if not isinstance(o, dict) or not isinstance(o.get("name"), str):
            raise InvalidRequest(f"outputs[{i}] must be an object with a string 'name'")
        p = o.get("parameters") or {}
        if not isinstance(p, dict):
            raise InvalidRequest(f"outputs[{i}] parameters must be an object")
        b = p.get("binary_data")
        outputs.append(RequestedOutput(o["name"], None if b is None else bool(b),
                                       {k: v for k, v in p.items() if k != "binary_data"}))
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise InvalidRequest("request parameters must be an object")
    rid = doc.get("id", "")
    return RequestLayout(tuple(out), outputs, rid if isinstance(rid, str) else str(rid), params, max_depth)


_RESPONSE_HEADS = Memo()


def answered_outputs(req: InferInput, outputs: list[Tensor]) -> list[tuple[Tensor, bool]]:
    """The outputs an HTTP answer carries (those ``req`` asks for, else all), each with
    whether it goes binary (its own ``binary_data``, else the request's ``binary_data_output``)."""
    default_binary = bool(req.parameters.get("binary_data_output", False))
    wanted = {o.name: o for o in req.outputs}
    chosen: list[tuple[Tensor, bool]] = []
    for t in outputs:
        if wanted and t.name not in wanted:
            continue
        o = wanted.get(t.name)
        chosen.append((t, default_binary if o is None or o.binary is None else o.binary))
    return chosen


def encode_http_response(
    model: str, version: str, req: InferInput, outputs: list[Tensor], parameters: dict[str, str]
) -> tuple[bytes, int | None]:
    """The response body and, when any output is binary, the JSON header length. A header
    that carries no data (every output binary) is encoded once per layout (:class:`Memo`)."""
    chosen = answered_outputs(req, outputs)
    blobs = [t.raw for t, binary in chosen if binary]
    key = None
    if blobs and len(blobs) == len(chosen):  # the header is a function of the layout alone
        key = (model, version, req.id, tuple(parameters.items()),
               tuple((t.name, t.datatype, tuple(t.shape), len(t.raw)) for t, _ in chosen))
        head = _RESPONSE_HEADS.get(key)
        if head is not None:
            return b"".join([head, *blobs]), len(head)
    head = response_head(model, version, req.id, parameters,
                         [(t, len(t.raw) if binary else None) for t, binary in chosen])
    if key is not None:
        _RESPONSE_HEADS.put(key, head)
    if not blobs:
        return head, None
    return b"".join([head, *blobs]), len(head)


def response_head(model: str, version: str, rid: str, parameters: dict[str, Any],
                  outputs: Sequence[tuple[Tensor, int | None]]) -> bytes:
    """An HTTP answer's JSON: each output with its ``binary_data_size`` (the int beside it),
    or with its values as ``data`` (None beside it; only then is its ``raw`` read)."""
    items = []
    for t, binary_size in outputs:
        item: dict[str, Any] = {"name": t.name, "datatype": t.datatype, "shape": t.shape}
        if binary_size is not None:
            item["parameters"] = {"binary_data_size": binary_size}
        else:
            item["data"] = raw_to_json(t)
        items.append(item)
    doc: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": items}
    if rid:
        doc["id"] = rid
    if parameters:
        doc["parameters"] = parameters
    return json.dumps(doc, separators=(",", ":")).encode()


# --------------------------------------------------------------------------- gRPC


def parse_grpc_infer(req: pb.ModelInferRequest, raws: list[memoryview] | None = None,
                     sig: Signature | None = None, model: str = "") -> InferInput:
    """Decode a gRPC infer request; ``raws``: its raw_input_contents when they were cut out of
    the message (:func:`gateway.frontdoor.decode.split_grpc`). Given model ``model``'s
    signature ``sig``, what it declares is checked first (:func:`check_grpc`)."""
    contents = req.raw_input_contents if raws is None else raws
    shapes, outputs = check_grpc(req, contents, sig, model)
    return grpc_input(req, contents, shapes, outputs, sig)


def grpc_input(req: pb.ModelInferRequest, contents: Sequence[bytes | memoryview], shapes: list[list[int]],
               outputs: list[RequestedOutput], sig: Signature | None = None) -> InferInput:
    """The request :func:`check_grpc` read ``shapes`` and ``outputs`` of (against ``sig``,
    when given: the driver then does not check it again)."""
    out: list[Tensor] = []
    for i, (inp, shape) in enumerate(zip(req.inputs, shapes, strict=True)):
        t = Tensor(inp.name, inp.datatype, shape, contents[i] if contents else _grpc_contents(inp, inp.datatype, shape))
        check_size(t)
        out.append(t)
    params = {k: _param_value(v) for k, v in req.parameters.items()} if req.parameters else {}
    return InferInput(out, outputs, req.id, params, sig, _rows(sig, shapes[0]) if sig is not None else 1)


def _rows(sig: Signature, shape: list[int]) -> int:
    """A request checked against ``sig``: its rows (its inputs agree on them), from its first input's ``shape``."""
    return shape[0] if sig.batched and shape else 1


def check_grpc(req: pb.ModelInferRequest, contents: Sequence[bytes | memoryview], sig: Signature | None = None,
               model: str = "") -> tuple[list[list[int]], list[RequestedOutput]]:
    """What gRPC request ``req`` declares, read without its data: each input's shape and the
    outputs it asks for. Given ``sig``, the declared tensors (names, datatypes, shapes, the
    sizes of raw ``contents``, the counts of typed contents) are checked against it, so no
    element is read of a request its model would refuse."""
    if contents and len(contents) != len(req.inputs):
        raise InvalidRequest(f"{len(contents)} raw_input_contents for {len(req.inputs)} inputs")
    if not req.inputs:
        raise InvalidRequest("request has no inputs")
    shapes: list[list[int]] = []
    for inp in req.inputs:
        dt = inp.datatype
        if dt not in DTYPE_SIZE:
            raise InvalidRequest(f"input '{inp.name}': unknown datatype {dt!r}; known: {sorted(DTYPE_SIZE)}")
        shape = list(inp.shape)
        if any(d < 0 for d in shape):
            raise InvalidRequest(f"input '{inp.name}': shape {shape} has a negative dimension")
        if inp.parameters:
            refuse_shm(inp.name, inp.parameters)
        shapes.append(shape)
    outputs = [RequestedOutput(o.name, None, {k: _param_value(v) for k, v in o.parameters.items()})
               for o in req.outputs]
    if sig is not None:
        check_signature(sig, model, (TensorLayout(i.name, i.datatype, sh, None, None)
                                     for i, sh in zip(req.inputs, shapes, strict=True)), outputs)
        for i, (inp, shape) in enumerate(zip(req.inputs, shapes, strict=True)):
            if not contents:
                _check_count(inp, shape)
            elif DTYPE_SIZE[inp.datatype]:
                _check_length(inp.name, inp.datatype, shape, len(contents[i]))
            else:
                check_bytes_room(inp.name, shape, len(contents[i]))
    return shapes, outputs


def _check_count(inp: pb.ModelInferRequest.InferInputTensor, shape: list[int]) -> None:
    """Typed contents must hold as many values as ``shape`` declares (counted, not read)."""
    fld = _GRPC_CONTENTS.get(inp.datatype)
    if fld is None:
        raise InvalidRequest(f"input '{inp.name}': {inp.datatype} must be sent in raw_input_contents")
    n = len(getattr(inp.contents, fld))
    if n != _element_count(shape):
        raise InvalidRequest(f"input '{inp.name}': {n} values do not match shape {shape}")


def _grpc_contents(inp: pb.ModelInferRequest.InferInputTensor, dt: str, shape: list[int]) -> bytes:
    _check_count(inp, shape)
    values = list(getattr(inp.contents, _GRPC_CONTENTS[dt]))
    if dt == "BYTES":
        return b"".join(_LEN.pack(len(v)) + v for v in values)
    try:
        return np.asarray(values, dtype=NP_DTYPE[dt]).tobytes()
    except (ValueError, OverflowError) as e:
        raise InvalidRequest(f"input '{inp.name}': values are not {dt}: {e}") from None


def _param_value(p: pb.InferParameter) -> Any:
    kind = p.WhichOneof("parameter_choice")
    return getattr(p, kind) if kind else None


def set_grpc_param(params: Any, key: str, value: Any) -> None:
    """Set one entry of a protobuf ``map<string, InferParameter>``."""
    if isinstance(value, bool):
        params[key].bool_param = value
    elif isinstance(value, int):
        params[key].int64_param = value
    elif isinstance(value, float):
        params[key].double_param = value
    else:
        params[key].string_param = str(value)


def encode_grpc_response(
    model: str, version: str, req: InferInput, outputs: list[Tensor], parameters: dict[str, Any]
) -> pb.ModelInferResponse:
    wanted = {o.name for o in req.outputs}
    resp = pb.ModelInferResponse(model_name=model, model_version=version, id=req.id)
    for t in outputs:
        if wanted and t.name not in wanted:
            continue
        resp.outputs.add(name=t.name, datatype=t.datatype, shape=t.shape)
        resp.raw_output_contents.append(bytes(t.raw))
    for k, v in parameters.items():
        set_grpc_param(resp.parameters, k, v)
    return resp


# --------------------------------------------------------------------------- validation


def validate(sig: Signature, model: str, req: InferInput) -> int:
    """Check ``req`` against the model's signature; return its rows along the batch dimension."""
    return check_signature(sig, model, req.inputs, req.outputs)



