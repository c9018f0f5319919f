"""The floor of a refusal: the gateway's own HTTP server (``gateway.frontdoor.httpserver``, on the
event loop ``headrace serve`` runs) with a handler that answers every POST ``429`` at once,
reading nothing of it. No routing, no decoding, no scheduling, no metrics. What a client waits for its refusals during a burst is
what reading and answering requests one after another costs on this machine, before any of
the gateway's work.

GETs (the load generator's readiness and metadata probes) get the answers ``SOURCE`` (a
gateway's base URL) gives, fetched once each.

    .venv/bin/python -m bench.refusal_floor PORT SOURCE
"""

from __future__ import annotations

import asyncio
import sys
import urllib.error
import urllib.request

from gateway.errors import REASON_HEADER
from gateway.frontdoor.httpserver import HttpRequest, HttpResponse, HttpServer, error_response
from gateway.serving import run_on_serve_loop

REFUSAL = error_response(429, "refused", (("Retry-After", "1"), (REASON_HEADER, "infeasible")))


class Floor:
    def __init__(self, source: str) -> None:
        self.source = source.rstrip("/")
        self.gets: dict[str, HttpResponse] = {}

    def __call__(self, req: HttpRequest) -> HttpResponse:
        if req.method == "POST":
            return REFUSAL
        if req.path not in self.gets:  # a probe, once per path: blocking is fine here
            try:
                with urllib.request.urlopen(self.source + req.path, timeout=5) as r:
                    self.gets[req.path] = HttpResponse(r.status, r.read(), r.headers.get("Content-Type"))
            except urllib.error.HTTPError as e:
                return error_response(e.code, f"{self.source} answered {e.code}")
        return self.gets[req.path]


async def serve(port: int, source: str) -> None:
    server = HttpServer(Floor(source), 1 << 20)
    await server.start("127.0.0.1", port)
    await asyncio.Event().wait()


if __name__ == "__main__":
    run_on_serve_loop(serve(int(sys.argv[1]), sys.argv[2]))
