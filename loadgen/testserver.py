"""A tiny KServe v2 server for testing the load generator and measuring its capacity.

It serves one model ``echo`` (one FP32 input ``INPUT0`` [-1, 4], one output) over HTTP
(aiohttp) and/or gRPC (grpc.aio). Behaviour is injected: ``delay(now) -> seconds`` (e.g. a
1-s stall), ``reject_every`` (answer 429 / RESOURCE_EXHAUSTED to every n-th request) and
``variant`` (returned as the ``headrace_variant`` response parameter) and ``reject_reason``
(sent with each reject as headrace's reject-reason header / trailing metadata). ``seen`` and
``headers``, when lists, collect what each inference request carried.

``python -m loadgen.testserver --http-port P [--grpc-port Q] [--raw]`` runs it standalone;
``--raw`` serves HTTP with a minimal asyncio protocol (fixed answer, no parsing), the
cheapest possible endpoint for capacity benchmarks.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.errors import REASON_HEADER

MODEL = "echo"
METADATA = {
    "name": MODEL,
    "versions": ["1"],
    "platform": "headrace_test",
    "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}],
    "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 1]}],
}


@dataclass
class Behaviour:
    delay: Callable[[float], float] = lambda now: 0.0  # seconds to hold a request
    reject_every: int = 0  # 0: never
    reject_reason: str | None = None  # e.g. "infeasible" (at arrival) or "expired" (queued)
    variant: str | None = None
    models: tuple[str, ...] = (MODEL,)  # names served, all with the same signature
    chunked: bool = False  # HTTP: answer with Transfer-Encoding: chunked
    seen: list[bytes] | None = None  # when a list: every request's body (gRPC: first input)
    headers: list[dict[str, str]] | None = None  # when a list: every request's headers/metadata
    count: int = field(default=0)

    async def decide(self) -> bool:
        """Wait as told; True if this request is rejected."""
        self.count += 1
        d = self.delay(asyncio.get_running_loop().time())
        if d > 0:
            await asyncio.sleep(d)
        return bool(self.reject_every) and self.count % self.reject_every == 0


def _response_json(variant: str | None) -> bytes:
    doc: dict = {
        "model_name": MODEL,
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 1], "data": [0.0]}],
    }
    if variant:
        doc["parameters"] = {"headrace_variant": variant}
    return json.dumps(doc).encode()


def http_app(b: Behaviour):
    from aiohttp import web

    body = _response_json(b.variant)

    async def ready(_req: web.Request) -> web.Response:
        return web.Response(status=200)

    async def metadata(req: web.Request) -> web.Response:
        if req.match_info["model"] not in b.models:
            return web.json_response({"error": "unknown model"}, status=404)
        return web.json_response({**METADATA, "name": req.match_info["model"]})

    async def infer(req: web.Request) -> web.Response:
        data = await req.read()
        if b.seen is not None:
            b.seen.append(data)
        if b.headers is not None:
            b.headers.append({k.lower(): v for k, v in req.headers.items()})
        if req.match_info["model"] not in b.models:
            return web.json_response({"error": "unknown model"}, status=404)
        if await b.decide():
            headers = {REASON_HEADER: b.reject_reason} if b.reject_reason else None
            return web.json_response({"error": "rejected"}, status=429, headers=headers)
        if b.chunked:
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            resp.enable_chunked_encoding()
            await resp.prepare(req)
            await resp.write(body[:10])
            await resp.write(body[10:])
            await resp.write_eof()
            return resp
        return web.Response(body=body, content_type="application/json")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_get("/v2/health/ready", ready)
    app.router.add_get("/v2/health/live", ready)
    app.router.add_get("/v2/models/{model}", metadata)
    app.router.add_post("/v2/models/{model}/infer", infer)
    return app


def grpc_servicer(b: Behaviour):
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pbg

    class Servicer(pbg.GRPCInferenceServiceServicer):
        async def ServerReady(self, request, context):  # noqa: N802 (gRPC names)
            return pb.ServerReadyResponse(ready=True)

        async def ServerLive(self, request, context):  # noqa: N802
            return pb.ServerLiveResponse(live=True)

        async def ModelMetadata(self, request, context):  # noqa: N802
            if request.name not in b.models:
                await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown model {request.name}")
            r = pb.ModelMetadataResponse(
                name=request.name, versions=["1"], platform="headrace_test"
            )
            for t in METADATA["inputs"]:
                r.inputs.add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
            return r

        async def ModelInfer(self, request, context):  # noqa: N802
            if b.seen is not None:
                b.seen.append(bytes(request.raw_input_contents[0]))
            if b.headers is not None:
                b.headers.append({k: v for k, v in context.invocation_metadata()})
            if request.model_name not in b.models:
                await context.abort(grpc.StatusCode.NOT_FOUND, "unknown model")
            if await b.decide():
                if b.reject_reason:
                    context.set_trailing_metadata(((REASON_HEADER, b.reject_reason),))
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected")
            r = pb.ModelInferResponse(model_name=request.model_name)
            if b.variant:
                r.parameters["headrace_variant"].string_param = b.variant
            r.outputs.add(name="OUTPUT0", datatype="FP32", shape=[1, 1])
            r.raw_output_contents.append(b"\x00\x00\x00\x00")
            return r

    return Servicer()


class _RawHttp(asyncio.Protocol):
    """Answers every complete request with a fixed response (keep-alive, no parsing)."""

    GET_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"

    def __init__(self) -> None:
        self.buf = bytearray()
        self.t: asyncio.Transport | None = None
        self.post_ok = (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (len(_response_json(None)), _response_json(None))
        )
        self.meta = json.dumps(METADATA).encode()

    def connection_made(self, t) -> None:
        self.t = t

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            h = self.buf.find(b"\r\n\r\n")
            if h < 0:
                return
            head = bytes(self.buf[:h]).lower()
            i = head.find(b"\r\ncontent-length:")
            if i >= 0:
                j = head.find(b"\r\n", i + 2)
                n = int(head[i + 17 : j if j > 0 else None])
            else:
                n = 0
            if len(self.buf) < h + 4 + n:
                return
            del self.buf[: h + 4 + n]
            if head.startswith(b"post"):
                self.t.write(self.post_ok)  # type: ignore[union-attr]
            elif head.startswith(b"get /v2/models/"):
                self.t.write(  # type: ignore[union-attr]
                    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(self.meta), self.meta)
                )
            else:
                self.t.write(self.GET_OK)  # type: ignore[union-attr]


async def serve(
    b: Behaviour,
    http_port: int | None,
    grpc_port: int | None,
    raw: bool = False,
    reuse_port: bool = False,
) -> Callable[[], asyncio.Future]:
    """Start the servers on 127.0.0.1; returns an async ``stop()``."""
    stops = []
    if http_port is not None:
        if raw:
            srv = await asyncio.get_running_loop().create_server(
                _RawHttp, "127.0.0.1", http_port, reuse_port=reuse_port or None
            )

            async def stop_raw() -> None:
                srv.close()
                await srv.wait_closed()

            stops.append(stop_raw)
        else:
            from aiohttp import web

            runner = web.AppRunner(http_app(b), access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", http_port).start()
            stops.append(runner.cleanup)
    if grpc_port is not None:
        import grpc
        from tritonclient.grpc import service_pb2_grpc as pbg

        server = grpc.aio.server()
        pbg.add_GRPCInferenceServiceServicer_to_server(grpc_servicer(b), server)
        server.add_insecure_port(f"127.0.0.1:{grpc_port}")
        await server.start()

        async def stop_grpc() -> None:
            await server.stop(0)

        stops.append(stop_grpc)

    async def stop() -> None:
        for s in stops:
            await s()

    return stop  # type: ignore[return-value]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--http-port", type=int)
    ap.add_argument("--grpc-port", type=int)
    ap.add_argument("--raw", action="store_true", help="minimal fixed-answer HTTP server")
    ap.add_argument("--variant", default=None)
    ap.add_argument("--reuse-port", action="store_true", help="raw: share the port (SO_REUSEPORT)")
    args = ap.parse_args()

    async def run() -> None:
        stop = await serve(
            Behaviour(variant=args.variant),
            args.http_port,
            args.grpc_port,
            args.raw,
            args.reuse_port,
        )
        try:
            await asyncio.Event().wait()
        finally:
            await stop()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
