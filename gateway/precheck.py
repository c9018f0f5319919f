"""What a request declares, checked against its model's signature before its data is decoded.

An infer request says up front what it carries: the binary tensor extension's JSON header
gives each input's shape and ``binary_data_size``, a gRPC request its shapes and the size of
each raw content. Names, datatypes, shapes, the batch size (:func:`check_signature`) and
whether each size can hold its shape (:func:`check_bytes_room`) are checked from those alone,
so a request no model would take is refused before any per-element work: 63 MiB of
zero-length BYTES elements declared as 16 million of them is a 400 in microseconds instead of
a walk over every length prefix. A JSON request carries its data inline; one larger than any
valid request for its model could be (:func:`max_json_bytes`) is refused before it is parsed.

A ``-1`` dim has no bound here but the data's own size: a fixed-size datatype's bytes must
match its shape exactly (checked as the header is read), and a BYTES element takes at least
:data:`BYTES_PREFIX` bytes, so a shape declaring more elements than its data can hold is
refused unread. Everything here reads only shapes and sizes (no clock, no I/O).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Protocol

from gateway.errors import InvalidRequest
from gateway.tensors import RequestedOutput, RequestLayout, Signature


class Shaped(Protocol):
    """A tensor as far as its signature check reads it (:class:`Tensor`, :class:`TensorLayout`)."""

    @property
    def name(self) -> str: ...
    @property
    def datatype(self) -> str: ...
    @property
    def shape(self) -> list[int]: ...


def check_signature(sig: Signature, model: str, inputs: Iterable[Shaped], outputs: Iterable[RequestedOutput]) -> int:
    """:func:`~gateway.codec.validate` on what a request declares (names, datatypes, shapes, outputs), which
    needs none of its data: its rows along the batch dimension."""
    seen = set()
    rows = None
    for t in inputs:
        s = sig.inputs.get(t.name)
        if s is None:
            raise InvalidRequest(f"model '{model}' has no input '{t.name}'; inputs: {sorted(sig.inputs)}")
        if t.name in seen:
            raise InvalidRequest(f"input '{t.name}' is given twice")
        seen.add(t.name)
        if t.datatype != s.datatype:
            raise InvalidRequest(f"input '{t.name}': datatype {t.datatype} does not match the model's {s.datatype}")
        dims = t.shape[1:] if sig.batched else t.shape
        if len(dims) != len(s.dims) or any(d != e and e != -1 for d, e in zip(dims, s.dims, strict=True)):
            want = ([-1] if sig.batched else []) + list(s.dims)
            raise InvalidRequest(f"input '{t.name}': shape {t.shape} does not match the model's {want}")
        if sig.batched:
            r = t.shape[0] if t.shape else 0
            if rows is not None and r != rows:
                raise InvalidRequest(f"input '{t.name}': batch size {r} differs from other inputs ({rows})")
            rows = r
    missing = set(sig.inputs) - seen
    if missing:
        raise InvalidRequest(f"model '{model}' needs inputs {sorted(missing)}")
    for o in outputs:
        if o.name not in sig.outputs:
            raise InvalidRequest(f"model '{model}' has no output '{o.name}'; outputs: {sorted(sig.outputs)}")
    if not sig.batched:
        return 1
    if not rows or rows < 1:
        raise InvalidRequest(f"batch size must be at least 1, got {rows}")
    if rows > sig.max_batch_size:
        raise InvalidRequest(f"batch size {rows} exceeds the model's max_batch_size ({sig.max_batch_size})")
    return rows


# A number in a valid JSON request takes at most this many bytes, its separator and a pretty
# printer's indentation included ("-1.2345678901234567e-308,\n" is 26), plus this much for the rest
JSON_BYTES_PER_ELEMENT = 64
JSON_SLACK_BYTES = 64 << 10
BYTES_PREFIX = 4  # the least a BYTES element takes: its little-endian uint32 length


def max_json_bytes(sig: Signature) -> int | None:
    """The most bytes a valid JSON request for ``sig`` takes: every input at its largest
    (max batch x its dims) at :data:`JSON_BYTES_PER_ELEMENT` a number, plus
    :data:`JSON_SLACK_BYTES`; None when an input has no largest (a -1 dim, or BYTES strings)."""
    elements = 0
    for s in sig.inputs.values():
        if s.datatype == "BYTES" or -1 in s.dims:
            return None
        elements += max(1, sig.max_batch_size) * math.prod(s.dims)
    return elements * JSON_BYTES_PER_ELEMENT + JSON_SLACK_BYTES


def check_json_size(sig: Signature, model: str, nbytes: int) -> None:
    """:class:`InvalidRequest` for a request's JSON of ``nbytes`` that no valid request for
    ``model`` is as large as (:func:`max_json_bytes`): refused before it is parsed."""
    most = max_json_bytes(sig)
    if most is not None and nbytes > most:
        raise InvalidRequest(
            f"request JSON ({nbytes} bytes) is larger than any valid request for model '{model}' "
            f"({most} bytes: its inputs at max batch, {JSON_BYTES_PER_ELEMENT} bytes a number, "
            f"and {JSON_SLACK_BYTES} more)")


def check_layout(sig: Signature, model: str, layout: RequestLayout) -> None:
    """Check what a request's JSON header declares against ``sig`` before its binary data is
    read: names, datatypes, shapes and batch size (:func:`check_signature`), and a BYTES
    input's binary size against its element count (:func:`check_bytes_room`). The sizes of
    fixed-size inputs were matched to their shapes as the header was read."""
    check_signature(sig, model, layout.inputs, layout.outputs)
    for t in layout.inputs:
        if t.size is not None and t.datatype == "BYTES":
            check_bytes_room(t.name, t.shape, t.size)


def check_bytes_room(name: str, shape: list[int], nbytes: int) -> None:
    """:class:`InvalidRequest` when ``nbytes`` cannot hold the BYTES elements ``shape``
    declares (each takes at least :data:`BYTES_PREFIX`), before any element is read."""
    n = math.prod(shape)
    if n * BYTES_PREFIX > nbytes:
        raise InvalidRequest(f"input '{name}': shape {shape} declares {n} BYTES elements, which take at least "
                             f"{n * BYTES_PREFIX} bytes; the data has {nbytes}")


def bytes_elements(inputs: Iterable[Shaped]) -> int:
    """How many BYTES elements ``inputs`` declare: the length prefixes a decode walks."""
    return sum(math.prod(t.shape) for t in inputs if t.datatype == "BYTES")
