"""The floor of a Python gRPC front door: a grpc.aio server (on uvloop, like ``headrace
serve``) that answers every ``ModelInfer`` by echoing its inputs as outputs, with no
scheduling, no backend call and no metrics. What a client waits for it is what grpc.aio
alone costs a request on this machine.

    .venv/bin/python -m bench.grpc_echo PORT
"""

from __future__ import annotations

import asyncio
import sys

import grpc
from tritonclient.grpc import service_pb2 as pb

from gateway.grpc_server import SERVICE


async def _model_infer(raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
    req = pb.ModelInferRequest.FromString(raw)
    resp = pb.ModelInferResponse(model_name=req.model_name, model_version="1", id=req.id)
    for t in req.inputs:
        resp.outputs.add(name=t.name.replace("INPUT", "OUTPUT"), datatype=t.datatype, shape=t.shape)
    resp.raw_output_contents.extend(req.raw_input_contents)
    return resp.SerializeToString()


async def serve(port: int) -> None:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        SERVICE, {"ModelInfer": grpc.unary_unary_rpc_method_handler(_model_infer)}),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0].isdigit():
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    try:
        import uvloop
    except ImportError:
        uvloop = None
    run = uvloop.run if uvloop is not None else asyncio.run
    try:
        run(serve(int(args[0])))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
