"""The HTTP replica client against a scripted server: outputs are cut from each answer's
own bytes (a repeated header layout never carries data over), JSON outputs decode, and an
answer that claims more binary bytes than it sent is a definite INTERNAL error."""

from __future__ import annotations

import asyncio
import json

import grpc
import numpy as np
import pytest

from gateway.backends.http import TritonHttpReplica
from gateway.codec import Tensor
from gateway.errors import BackendError


async def _scripted_server(answers: list[tuple[bytes, int | None]]) -> tuple[asyncio.Server, list[bytes]]:
    """Answers each request with the next (body, inference header length) of ``answers``;
    records each request's body."""
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while answers:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length"))
            seen.append(await reader.readexactly(length))
            body, hl = answers.pop(0)
            extra = b"Inference-Header-Content-Length: %d\r\n" % hl if hl is not None else b""
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n" % (len(body), extra) + body)
            await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0), seen


def _binary_answer(values: np.ndarray, claimed: int | None = None) -> tuple[bytes, int]:
    head = json.dumps({"model_name": "m", "outputs": [{
        "name": "y", "datatype": "FP32", "shape": list(values.shape),
        "parameters": {"binary_data_size": claimed if claimed is not None else values.nbytes}}]}).encode()
    return head + values.tobytes(), len(head)


def _input(values: np.ndarray) -> list[Tensor]:
    return [Tensor("x", "FP32", list(values.shape), values.tobytes())]


def test_each_answer_is_cut_from_its_own_bytes_and_json_outputs_decode():
    a, b = np.array([[1, 2]], np.float32), np.array([[3, 4]], np.float32)
    json_answer = json.dumps({"outputs": [{"name": "y", "datatype": "FP32", "shape": [1, 2],
                                           "data": [5.0, 6.0]}]}).encode()

    async def main() -> list[list[Tensor]]:
        server, seen = await _scripted_server([_binary_answer(a), _binary_answer(b), (json_answer, None)])
        client = TritonHttpReplica(f"127.0.0.1:{server.sockets[0].getsockname()[1]}")
        try:
            outs = [await client.infer("m", _input(v), timeout=5.0) for v in (a, b, b)]
        finally:
            await client.close()
            server.close()
        # the same layout twice: one header, each request's own tensor bytes after it
        assert seen[0][-8:] == a.tobytes() and seen[1][-8:] == b.tobytes() and seen[0][:-8] == seen[1][:-8]
        return outs

    outs = asyncio.run(main())
    assert [bytes(o[0].raw) for o in outs] == [a.tobytes(), b.tobytes(), np.array([5, 6], np.float32).tobytes()]
    assert all(o[0].shape == [1, 2] and o[0].name == "y" for o in outs)


def test_an_answer_claiming_missing_bytes_is_an_internal_error():
    a = np.array([[1, 2]], np.float32)

    async def main() -> None:
        server, _ = await _scripted_server([_binary_answer(a, claimed=16)])
        client = TritonHttpReplica(f"127.0.0.1:{server.sockets[0].getsockname()[1]}")
        try:
            await client.infer("m", _input(a), timeout=5.0)
        finally:
            await client.close()
            server.close()

    with pytest.raises(BackendError, match="claim 16 binary bytes, 8 sent") as e:
        asyncio.run(main())
    assert e.value.grpc_code == grpc.StatusCode.INTERNAL and not e.value.retryable


def test_on_a_pooled_connection_the_batch_leaves_before_the_first_await():
    a, b = np.array([[1, 2]], np.float32), np.array([[3, 4]], np.float32)

    async def main() -> None:
        server, seen = await _scripted_server([_binary_answer(a), _binary_answer(b)])
        client = TritonHttpReplica(f"127.0.0.1:{server.sockets[0].getsockname()[1]}")
        try:
            await client.infer("m", _input(a), timeout=5.0)  # opens the connection the pool keeps
            pending = client.infer("m", _input(b), timeout=5.0)  # not awaited yet
            for _ in range(100):
                if len(seen) == 2:
                    break
                await asyncio.sleep(0.01)
            assert len(seen) == 2 and seen[1][-8:] == b.tobytes()  # the server already has it
            assert bytes((await pending)[0].raw) == b.tobytes()
        finally:
            await client.close()
            server.close()

    asyncio.run(main())
