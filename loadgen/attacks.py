"""Adversarial clients: each one client (one source address) doing what a front door must not
let it do to everyone else. They run in their own process so that their work does not slow the
well-behaved client measuring beside them:

    python -m loadgen.attacks NAME --http H:P --grpc H:P --model M [--source 127.0.0.2]
                              [--scale 1.0] [--duration 20]

``--scale`` shrinks each attack from the full size it is named by (the figures of the front
door isolation issue) for tests. The attacks:

- ``declared``: 4 connections send the head of a 64 MiB infer body and nothing more, again
  as soon as they are closed.
- ``pipeline``: one connection pipelines 20,000 ``GET /metrics`` and ``GET /v2/models/stats``
  and reads nothing.
- ``bytes_body`` / ``json_body``: one large invalid infer body after another: 63 MiB of
  zero-length BYTES elements (binary extension), 28 MiB of JSON numbers.
- ``idle_h2``: 20,000 idle HTTP/2 connections to the gRPC port (the preface and a SETTINGS
  frame, then nothing).
- ``keepalive``: 10,032 keep-alive connections, each asking ``/v2/health/live`` once.
- ``timeout``: infer requests with ``parameters.timeout = 10**20``, 50 a second (x scale), sharing
  batches with everyone else's.
- ``queued``: 60 requests of 8 MiB at a time with an hour's deadline, again as each answers
  (a second after a refusal), to ``--queue-model`` (a slow one: they wait in the gateway's
  queue).
"""

from __future__ import annotations

import argparse
import json
import resource
import select
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable

MiB = 1 << 20
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + struct.pack(">I", 0)[1:] + b"\x04\x00" + struct.pack(">I", 0)


def _addr(s: str) -> tuple[str, int]:
    host, _, port = s.rpartition(":")
    return host, int(port)


def _connect(addr: tuple[str, int], source: str, timeout: float = 5.0) -> socket.socket | None:
    try:
        return socket.create_connection(addr, timeout=timeout, source_address=(source, 0))
    except OSError:
        return None


def _readable(s: socket.socket, timeout: float = 0.0) -> bool:
    """Whether ``s`` has something to read (poll: file descriptors past 1,024 included)."""
    p = select.poll()
    p.register(s, select.POLLIN)
    return bool(p.poll(timeout * 1e3))


def _drain(s: socket.socket) -> bool:
    """Read what is there without waiting; False once the server has closed."""
    try:
        while _readable(s):
            if not s.recv(1 << 16):
                return False
    except OSError:
        return False
    return True


def _infer_head(model: str, length: int, extra: str = "") -> bytes:
    return (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n{extra}\r\n").encode()


class Attack:
    def __init__(self, a: argparse.Namespace) -> None:
        self.http, self.grpc = _addr(a.http), _addr(a.grpc)
        self.model, self.source, self.scale = a.model, a.source, a.scale
        self.queue_model = a.queue_model or a.model
        self.end = time.monotonic() + a.duration
        self.sent = 0  # requests or connections the attack made

    def running(self) -> bool:
        return time.monotonic() < self.end

    def n(self, full: int) -> int:
        return max(1, int(full * self.scale))

    def hold(self, socks: list[socket.socket]) -> None:
        while self.running():
            time.sleep(0.2)
        for s in socks:
            s.close()

    # ---- the attacks
    def declared(self) -> None:
        head = _infer_head(self.model, 64 * MiB)
        conns: list[socket.socket | None] = [None] * 4
        while self.running():
            for i, s in enumerate(conns):
                if s is None or not _drain(s):
                    if s is not None:
                        s.close()
                    s = conns[i] = _connect(self.http, self.source)
                    if s is not None:
                        s.sendall(head)
                        self.sent += 1
            time.sleep(0.05)
        for s in conns:
            if s is not None:
                s.close()

    def pipeline(self) -> None:
        s = _connect(self.http, self.source)
        if s is None:
            return
        s.setblocking(False)
        reqs = (b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" + b"GET /v2/models/stats HTTP/1.1\r\nHost: x\r\n\r\n")
        todo = self.n(20_000) // 2
        while todo and self.running():
            try:
                s.send(reqs)
                todo -= 1
                self.sent += 2
            except BlockingIOError:  # the server stopped reading it: what it sent waits in the socket
                time.sleep(0.05)
            except OSError:
                break
        self.hold([s])

    def _big_bodies(self, body: bytes, head: bytes) -> None:
        while self.running():
            s = _connect(self.http, self.source, timeout=30.0)
            if s is None:
                time.sleep(0.1)
                continue
            try:
                s.sendall(head + body)
                s.recv(1 << 16)
                self.sent += 1
            except OSError:
                pass
            finally:
                s.close()

    def bytes_body(self) -> None:
        n = self.n(63 * MiB) // 4  # zero-length elements: 4 bytes each (their length)
        header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [n], "datatype": "BYTES",
                                         "parameters": {"binary_data_size": 4 * n}}]}).encode()
        head = (f"POST /v2/models/{self.model}/infer HTTP/1.1\r\nHost: x\r\n"
                f"Inference-Header-Content-Length: {len(header)}\r\n"
                f"Content-Length: {len(header) + 4 * n}\r\nConnection: close\r\n\r\n").encode()
        self._big_bodies(header + b"\0" * (4 * n), head)

    def json_body(self) -> None:
        n = self.n(28 * MiB) // 4  # "1.5," per number
        body = (b'{"inputs":[{"name":"INPUT0","shape":[%d],"datatype":"FP32","data":[' % n
                + b"1.5," * (n - 1) + b"1.5]}]}")
        self._big_bodies(body, _infer_head(self.model, len(body), "Connection: close\r\n"))

    def _open(self, addr: tuple[str, int], n: int, first: bytes) -> list[socket.socket]:
        """Up to ``n`` connections to ``addr``, each having sent ``first``."""
        socks = []
        for _ in range(n):
            if not self.running():
                break
            s = _connect(addr, self.source)
            if s is None:
                continue
            try:
                s.sendall(first)
            except OSError:
                s.close()
                continue
            socks.append(s)
            self.sent += 1
        return socks

    def idle_h2(self) -> None:
        self.hold(self._open(self.grpc, self.n(20_000), H2_PREFACE))

    def keepalive(self) -> None:
        socks = self._open(self.http, self.n(10_032), b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        while self.running():  # read answers, keep every connection open
            socks = [s for s in socks if _drain(s) or s.close()]
            time.sleep(0.2)
        for s in socks:
            s.close()

    def timeout(self) -> None:
        body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32",
                                       "data": [1.0] * 16}], "parameters": {"timeout": 10 ** 20}}).encode()
        req = _infer_head(self.model, len(body)) + body
        s, t = None, time.monotonic()
        while self.running():
            if s is None or not _drain(s):
                if s is not None:
                    s.close()
                s = _connect(self.http, self.source)
                if s is None:
                    time.sleep(0.1)
                    continue
            try:
                s.sendall(req)
                self.sent += 1
            except OSError:
                s.close()
                s = None
            t += 1 / (50 * self.scale)
            time.sleep(max(0.0, t - time.monotonic()))

    def queued(self) -> None:
        n = 8 * MiB // 4
        header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, n], "datatype": "FP32",
                                         "parameters": {"binary_data_size": 4 * n}}]}).encode()
        head = (f"POST /v2/models/{self.queue_model}/infer HTTP/1.1\r\nHost: x\r\nx-headrace-slo-ms: 3600000\r\n"
                f"Inference-Header-Content-Length: {len(header)}\r\nContent-Length: {len(header) + 4 * n}\r\n\r\n"
                ).encode()
        req = head + header + b"\0" * (4 * n)

        def one() -> None:
            while self.running():
                s = _connect(self.http, self.source, timeout=60.0)
                if s is None:
                    time.sleep(0.1)
                    continue
                answer = b""
                try:
                    s.sendall(req)
                    self.sent += 1
                    answer = s.recv(1 << 16)
                except OSError:
                    pass
                finally:
                    s.close()
                if not answer.startswith(b"HTTP/1.1 200"):  # refused: its place is taken again a
                    time.sleep(1.0)  # second later (a flood of refused uploads is another attack)

        threads = [threading.Thread(target=one, daemon=True) for _ in range(self.n(60))]
        for t in threads:
            t.start()
        for t in threads:  # answers may take an hour: what is still waiting is left (daemon threads)
            t.join(timeout=max(0.0, self.end - time.monotonic()))


ATTACKS: dict[str, Callable[[Attack], None]] = {
    name: getattr(Attack, name)
    for name in ("declared", "pipeline", "bytes_body", "json_body", "idle_h2", "keepalive", "timeout", "queued")
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadgen.attacks", description=__doc__.split("\n\n")[0])
    p.add_argument("name", choices=sorted(ATTACKS))
    p.add_argument("--http", required=True, help="the gateway's HTTP host:port")
    p.add_argument("--grpc", required=True, help="the gateway's gRPC host:port")
    p.add_argument("--model", required=True)
    p.add_argument("--queue-model", default=None, help="the model the queued attack sends to (default --model)")
    p.add_argument("--source", default="127.0.0.2", help="the address the attacker connects from")
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--duration", type=float, default=20.0)
    a = p.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    attack = Attack(a)
    ATTACKS[a.name](attack)
    print(json.dumps({"attack": a.name, "sent": attack.sent}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
