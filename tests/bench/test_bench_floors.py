"""The benchmarks' floor servers do what their rows claim: the refusal floor answers every
POST 429 without reading it and serves probes from its source once; the gRPC echo floor
answers with its inputs."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from bench import grpc_echo
from bench.refusal_floor import Floor
from gateway.errors import REASON_HEADER
from gateway.frontdoor.httpserver import HttpRequest


class _Source(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self) -> None:  # noqa: N802  (http.server's name)
        _Source.hits.append(self.path)
        if self.path == "/missing":
            self.send_error(404)
            return
        body = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_refusal_floor_refuses_posts_unread_and_serves_probes_from_its_source_once():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Source)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        floor = Floor(f"http://127.0.0.1:{server.server_address[1]}/")
        post = floor(HttpRequest("POST", "/v2/models/m/infer", {}, b"not even json"))
        assert post.status == 429 and dict(post.headers)[REASON_HEADER] == "infeasible"
        assert _Source.hits == []  # a refusal asks nobody
        for _ in range(3):
            got = floor(HttpRequest("GET", "/v2/models/m", {}, b""))
            assert got.status == 200 and json.loads(got.body) == {"path": "/v2/models/m"}
        assert _Source.hits == ["/v2/models/m"]  # fetched once, then cached
        assert floor(HttpRequest("GET", "/missing", {}, b"")).status == 404
    finally:
        server.shutdown()
        server.server_close()


def test_grpc_echo_floor_answers_with_its_inputs():
    req = pb.ModelInferRequest(model_name="echo", id="7")
    req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    x = np.arange(4, dtype=np.float32).tobytes()
    req.raw_input_contents.append(x)
    resp = pb.ModelInferResponse.FromString(asyncio.run(grpc_echo.echo()(req.SerializeToString(), None)))
    assert (resp.id, resp.outputs[0].name, list(resp.outputs[0].shape)) == ("7", "OUTPUT0", [1, 4])
    assert resp.raw_output_contents[0] == x


def test_grpc_echo_floor_refuses_unknown_modes():
    assert grpc_echo.main(["1234", "ftp", "host:1"]) == 2
    assert grpc_echo.main(["port"]) == 2
