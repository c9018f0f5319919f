"""What a decoded inference request is made of, and what a model's signature says: plain
records the codec (:mod:`gateway.codec`) builds and the checks before decoding
(:mod:`gateway.precheck`) read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Tensor:
    name: str
    datatype: str
    shape: list[int]
    raw: bytes | memoryview


@dataclass(slots=True)
class RequestedOutput:
    name: str
    binary: bool | None = None  # HTTP only: None = follow the request-level default
    parameters: dict[str, Any] = field(default_factory=dict)  # forwarded (classification, ...)


@dataclass(slots=True)
class InferInput:
    """One decoded inference request, protocol-neutral. ``outputs`` and ``parameters`` are
    shared by requests that came with the same HTTP header (:class:`Memo`): read-only."""

    inputs: list[Tensor]
    outputs: list[RequestedOutput] = field(default_factory=list)  # empty = all outputs
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    checked: Signature | None = None  # the signature its declarations were checked against, as decoded
    rows: int = 1  # its rows along the batch dimension, once checked


@dataclass(frozen=True, slots=True)
class TensorSig:
    name: str
    datatype: str
    dims: tuple[int, ...]  # without the batch dimension; -1 = variable


@dataclass(frozen=True)
class Signature:
    """A model's inputs and outputs as its Triton backend declares them."""

    inputs: dict[str, TensorSig]
    outputs: dict[str, TensorSig]
    max_batch_size: int  # 0: the model takes no batch dimension

    @property
    def batched(self) -> bool:
        return self.max_batch_size > 0


@dataclass(frozen=True, slots=True)
class TensorLayout:
    """A tensor as a KServe v2 JSON header describes it: its bytes follow in the binary part
    (``size``) or came in the JSON itself (``raw``)."""

    name: str
    datatype: str
    shape: list[int]
    size: int | None  # binary_data_size; None: the data came in the JSON
    raw: bytes | None  # the JSON data as bytes (size is None)


@dataclass(frozen=True, slots=True)
class RequestLayout:
    """Everything an HTTP infer request's JSON header says: a pure function of its bytes."""

    inputs: tuple[TensorLayout, ...]
    outputs: list[RequestedOutput]
    id: str
    parameters: dict[str, Any]
    depth_checked: int  # the max_json_depth it was found within
