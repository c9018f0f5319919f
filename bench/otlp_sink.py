"""An OTLP/gRPC trace receiver that accepts every export and keeps nothing: the collector a
traced gateway exports to in ``bench.gateway_overhead``, so the gateway pays its real export
path (batching, protobuf encoding, a gRPC call) without a collector's own work on the host.

    .venv/bin/python -m bench.otlp_sink PORT [COUNT_FILE]

On SIGTERM/SIGINT it writes how many spans it received to COUNT_FILE (else stdout) and exits.
"""

from __future__ import annotations

import signal
import sys
import threading
from concurrent import futures

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as ts
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as tsg


class Sink(tsg.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans = 0

    def Export(self, request: ts.ExportTraceServiceRequest, context: grpc.ServicerContext
               ) -> ts.ExportTraceServiceResponse:
        self.spans += sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
        return ts.ExportTraceServiceResponse()


def main(argv: list[str]) -> int:
    port = int(argv[0])
    sink = Sink()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    tsg.add_TraceServiceServicer_to_server(sink, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.stop(grace=1.0)
    if len(argv) > 1:
        with open(argv[1], "w") as f:
            f.write(f"{sink.spans}\n")
    else:
        print(f"otlp sink: {sink.spans} spans received", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
