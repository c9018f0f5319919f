"""The floor of any proxy: a bare TCP relay, on the event loop ``headrace serve`` runs, that
copies bytes both ways, parsing nothing. What it adds over calling Triton directly is what
one more user-space process in the path costs on this machine (two socket reads, two writes
and their wake-ups a request), before any HTTP or gRPC work.

    .venv/bin/python -m bench.relay LISTEN_PORT TARGET_HOST:TARGET_PORT
"""

from __future__ import annotations

import asyncio
import socket
import sys

from gateway.serving import run_on_serve_loop


class _Pipe(asyncio.Protocol):
    """One direction's reader; writes what it reads to ``peer``."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if self.peer is not None and not self.peer.is_closing():
            self.peer.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None:
            self.peer.close()


class _Front(_Pipe):
    def __init__(self, host: str, port: int) -> None:
        super().__init__()
        self.target = (host, port)
        self.early: list[bytes] = []  # read before the back connection was up

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        asyncio.get_running_loop().create_task(self._connect())

    def data_received(self, data: bytes) -> None:
        if self.peer is None:
            self.early.append(data)
        else:
            self.peer.write(data)

    async def _connect(self) -> None:
        back = _Pipe()
        back.peer = self.transport
        try:
            t, _ = await asyncio.get_running_loop().create_connection(lambda: back, *self.target)
        except OSError:
            self.transport.close()  # type: ignore[union-attr]
            return
        if self.transport.is_closing():  # type: ignore[union-attr]
            t.close()
            return
        self.peer = t  # type: ignore[assignment]
        t.write(b"".join(self.early))
        self.early.clear()


async def serve(port: int, host: str, target_port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Front(host, target_port), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or ":" not in args[1]:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    host, tport = args[1].rsplit(":", 1)
    try:
        run_on_serve_loop(serve(int(args[0]), host, int(tport)))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
