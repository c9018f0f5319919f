"""Floors of a Python gRPC front door: grpc.aio servers, on the event loop ``headrace serve``
runs, that answer every ``ModelInfer`` with no scheduling, no validation and no metrics.

- ``echo``: answers at once with its inputs as outputs, calling nothing. What a client waits
  for it is what grpc.aio alone costs a request on this machine.
- ``http URL``: sends the request's tensors to Triton's HTTP endpoint at URL with the
  gateway's own replica client (``gateway.backends.http``) and answers with Triton's outputs:
  grpc.aio plus one Triton round trip, the least a gateway reaching Triton over HTTP does.
- ``grpc URL``: hands the request's bytes, unparsed, to Triton's gRPC endpoint at URL over a
  grpc.aio channel and returns Triton's answer's bytes: the least any Python gRPC proxy does.

    .venv/bin/python -m bench.grpc_echo PORT [echo | http URL | grpc URL]
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable

import grpc
from tritonclient.grpc import service_pb2 as pb

from gateway.codec import Tensor
from gateway.frontdoor.grpc import SERVICE
from gateway.serving import run_on_serve_loop

Handler = Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]


def _answer(req: pb.ModelInferRequest, raws: list[bytes]) -> bytes:
    resp = pb.ModelInferResponse(model_name=req.model_name, model_version="1", id=req.id)
    for t in req.inputs:
        resp.outputs.add(name=t.name.replace("INPUT", "OUTPUT"), datatype=t.datatype, shape=t.shape)
    resp.raw_output_contents.extend(raws)
    return resp.SerializeToString()


def echo() -> Handler:
    async def infer(raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        req = pb.ModelInferRequest.FromString(raw)
        return _answer(req, list(req.raw_input_contents))
    return infer


def via_http(url: str) -> Handler:
    from gateway.backends.http import TritonHttpReplica

    replica = TritonHttpReplica(url)

    async def infer(raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        req = pb.ModelInferRequest.FromString(raw)
        inputs = [Tensor(t.name, t.datatype, list(t.shape), r)
                  for t, r in zip(req.inputs, req.raw_input_contents, strict=True)]
        outs = await replica.infer(req.model_name, inputs, 10.0)
        return _answer(req, [bytes(o.raw) for o in outs])
    return infer


def via_grpc(url: str) -> Handler:
    call = grpc.aio.insecure_channel(url).unary_unary(f"/{SERVICE}/ModelInfer")

    async def infer(raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return await call(raw, timeout=10.0)
    return infer


MODES: dict[str, Callable[..., Handler]] = {"echo": echo, "http": via_http, "grpc": via_grpc}


async def serve(port: int, mode: str = "echo", *args: str) -> None:
    handler = MODES[mode](*args)  # built on the running loop: a replica client binds to it
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        SERVICE, {"ModelInfer": grpc.unary_unary_rpc_method_handler(handler)}),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    mode = args[1:] or ["echo"]
    ok_mode = mode == ["echo"] or (len(mode) == 2 and mode[0] in ("http", "grpc"))
    if not args or not args[0].isdigit() or not ok_mode:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    try:
        run_on_serve_loop(serve(int(args[0]), *mode))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
