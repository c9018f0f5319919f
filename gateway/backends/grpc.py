"""The replica pool: one grpc.aio channel per Triton server, batched inference with raw
tensor bytes, model metadata/config at startup, and ready probes.

A batch is one ``ModelInferRequest`` whose inputs are the requests' inputs concatenated
along the batch dimension, sent as raw bytes; the driver splits the response back by rows.

An error names the variant and what went wrong, never the server's address, which clients
must not learn (:class:`~gateway.errors.BackendError`); the address is in the gateway's log,
once when the server stops answering and once when it answers again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import grpc
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

from gateway.backends.tls import BackendTls
from gateway.codec import Signature, Tensor, TensorSig, set_grpc_param
from gateway.contract import Forward
from gateway.errors import BackendError, hide_address

# codes after which another replica may well succeed (the server is down or went away)
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN})

log = logging.getLogger("headrace.gateway")


class Reachability:
    """Logs a server's address when it stops answering and when it answers again: once each,
    not per failed call (a probe fails every period while it is down)."""

    __slots__ = ("url", "down")

    def __init__(self, url: str) -> None:
        self.url = url
        self.down = False

    def failed(self, variant: str, detail: str) -> None:
        if not self.down:
            self.down = True
            log.warning("Triton at %s (%s) does not answer: %s", self.url, variant, detail)

    def answered(self) -> None:
        if self.down:
            self.down = False
            log.info("Triton at %s answers again", self.url)

_DTYPE_OF_CONFIG = {v: k.removeprefix("TYPE_") for k, v in mc.DataType.items()}
_DTYPE_OF_CONFIG[mc.TYPE_STRING] = "BYTES"


@dataclass(frozen=True)
class ModelInfo:
    """What the gateway learns from a backend at startup."""

    signature: Signature
    metadata: pb.ModelMetadataResponse
    config: mc.ModelConfig


def channel_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        # a restarted replica is found again within a probe or two
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 500),
        ("grpc.enable_retries", 0),
    ]


class TritonReplica:
    """A client of one Triton server (shared by every variant served from it)."""

    def __init__(self, url: str, max_message_bytes: int = 64 << 20, tls: BackendTls | None = None) -> None:
        self.url = url  # for the gateway's log, never for a client's eyes
        self.reach = Reachability(url)
        options = channel_options(max_message_bytes)
        if tls is None:
            self._channel = grpc.aio.insecure_channel(url, options=options)
        else:
            self._channel = grpc.aio.secure_channel(url, tls.grpc_credentials(), options=options + tls.grpc_options())
        self._stub = pbg.GRPCInferenceServiceStub(self._channel)

    async def close(self) -> None:
        await self._channel.close(grace=None)

    async def infer(self, variant: str, inputs: list[Tensor], timeout: float | None,
                    forward: Forward | None = None, triton_timeout_us: int = 0, *,
                    trace_headers: tuple[tuple[str, str], ...] | None = None) -> list[Tensor]:
        """One batch: ``forward`` is what else the client asked of Triton (its version,
        parameters and outputs), ``triton_timeout_us`` Triton's ``timeout`` (0: none),
        ``trace_headers`` the W3C trace context (``traceparent``) sent as metadata."""
        req = pb.ModelInferRequest(model_name=variant)
        for t in inputs:
            req.inputs.add(name=t.name, datatype=t.datatype, shape=t.shape)
            req.raw_input_contents.append(bytes(t.raw) if isinstance(t.raw, memoryview) else t.raw)
        if forward is not None:
            req.model_version = forward.version
            for k, v in forward.parameters:
                set_grpc_param(req.parameters, k, v)
            for name, params in forward.outputs:
                o = req.outputs.add(name=name)
                for k, v in params:
                    set_grpc_param(o.parameters, k, v)
        if triton_timeout_us:
            req.parameters["timeout"].int64_param = triton_timeout_us
        try:
            resp = await self._stub.ModelInfer(req, timeout=timeout, metadata=trace_headers)
        except grpc.aio.AioRpcError as e:
            raise self._error(variant, e) from None
        outs = []
        raws = resp.raw_output_contents
        if len(raws) != len(resp.outputs):
            raise BackendError(f"{variant}: INTERNAL: {len(raws)} raw outputs for {len(resp.outputs)} outputs",
                               grpc.StatusCode.INTERNAL, False)
        for o, raw in zip(resp.outputs, raws, strict=True):
            outs.append(Tensor(o.name, o.datatype, list(o.shape), raw))
        return outs

    def _error(self, variant: str, e: grpc.aio.AioRpcError) -> BackendError:
        """The client's view of a failed call: the server's words without its address. A
        server that cannot be reached (UNAVAILABLE: gRPC's words name the address it
        tried) is said to be unreachable, and the address goes to the log."""
        code = e.code()
        if code == grpc.StatusCode.UNAVAILABLE:
            self.reach.failed(variant, f"{code.name}: {e.details()}")
            detail = "the replica cannot be reached"
        else:
            detail = hide_address(e.details() or "", self.url)
        return BackendError(f"{variant}: {code.name}: {detail}", code, code in RETRYABLE)

    async def ready(self, variant: str, timeout: float = 1.0) -> bool:
        try:
            r = await self._stub.ModelReady(pb.ModelReadyRequest(name=variant), timeout=timeout)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNAVAILABLE:
                self.reach.failed(variant, f"{e.code().name}: {e.details()}")
            return False
        except TimeoutError:
            return False
        self.reach.answered()
        return bool(r.ready)

    async def model_info(self, variant: str, timeout: float = 5.0) -> ModelInfo:
        try:
            md = await self._stub.ModelMetadata(pb.ModelMetadataRequest(name=variant), timeout=timeout)
            cfg = await self._stub.ModelConfig(pb.ModelConfigRequest(name=variant), timeout=timeout)
        except grpc.aio.AioRpcError as e:
            raise self._error(variant, e) from None
        self.reach.answered()
        return ModelInfo(signature_of(cfg.config), md, cfg.config)


def signature_of(cfg: mc.ModelConfig) -> Signature:
    def sig(t: mc.ModelInput | mc.ModelOutput) -> TensorSig:
        return TensorSig(t.name, _DTYPE_OF_CONFIG.get(t.data_type, "BYTES"), tuple(t.dims))

    return Signature(
        inputs={t.name: sig(t) for t in cfg.input},
        outputs={t.name: sig(t) for t in cfg.output},
        max_batch_size=cfg.max_batch_size,
    )
