"""What the access log and tracing see of each inference request, for both front doors.

The front doors hold ``observer: Observer | None``: None when the access log and tracing are
both off, and then they build nothing for it (the HTTP door's handler and the gRPC server's
ModelInfer handler are chosen once, at start). Otherwise each inference request gets a
:class:`Seen` when it arrives: its spans (tracing on) and what its log line needs, filled in
as the request goes (tenant, rows, request id), and answered once when its answer is known:
the line is written (:mod:`gateway.observe.accesslog`) and its spans end (:mod:`gateway.observe.tracing`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from gateway.errors import REASON_HEADER
from gateway.observe.accesslog import CANCELLED_HTTP, AccessLog, FrontDoor, rows_of

if TYPE_CHECKING:
    from gateway.codec import InferInput
    from gateway.frontdoor.httpserver import HttpResponse
    from gateway.observe.tracing import RequestTrace, Tracing

REQUEST_ID_HEADER = "x-request-id"  # a request id the client gave outside the KServe body


class Observer:
    """The access log and tracing, either of which may be off (None)."""

    def __init__(self, access_log: AccessLog | None, tracing: Tracing | None, clock: Callable[[], float]) -> None:
        self.access_log = access_log
        self.tracing = tracing
        self.clock = clock

    @classmethod
    def of(cls, access_log: AccessLog | None, tracing: Tracing | None,
           clock: Callable[[], float]) -> Observer | None:
        """None when both are off: the front doors then observe nothing."""
        return None if access_log is None and tracing is None else cls(access_log, tracing, clock)

    def request(self, protocol: FrontDoor, model: str | None, version: str, carrier: Mapping[str, str],
                received: float | None = None) -> Seen:
        """A request arriving now (read at ``received``, the door's clock; default now).
        ``carrier``: its headers / metadata, names lower-case (traceparent, x-request-id)."""
        now = self.clock()
        received = now if received is None else received
        trace = None
        if self.tracing is not None and model is not None:
            trace = self.tracing.request(protocol, model, carrier, now - received, version)
        return Seen(self, protocol, model, version, received, trace, carrier.get(REQUEST_ID_HEADER))

    def http_request(self, path: str, headers: Mapping[str, str], received: float | None) -> Seen | None:
        """The :class:`Seen` of an HTTP request to ``path``, or None when it is not an inference
        (``/v2/models/{model}[/versions/{version}]/infer``)."""
        parts = path.strip("/").split("/")
        if len(parts) not in (4, 6) or parts[:2] != ["v2", "models"] or parts[-1] != "infer":
            return None
        version = ""
        if len(parts) == 6:
            if parts[3] != "versions":
                return None
            version = unquote(parts[4])
        return self.request("http", unquote(parts[2]), version, headers, received)

    def http_refused(self, path: str, headers: Mapping[str, str], received: float, resp: HttpResponse) -> None:
        """A request the HTTP server refused before the door saw it (a limit, malformed HTTP):
        logged when its path, as far as it was read, is an inference."""
        seen = self.http_request(path, headers, received or None)
        if seen is not None:
            seen.http_answered(resp)

    def grpc_request(self, model: str | None, version: str, metadata: Iterable[tuple[str, Any]] | None) -> Seen:
        """The :class:`Seen` of a gRPC ModelInfer (``model`` None: its message did not parse)."""
        carrier = {k: v for k, v in metadata or () if isinstance(v, str)}
        return self.request("grpc", model, version, carrier)

    def close(self) -> None:
        """Write what the access log holds and export the spans left (once)."""
        if self.access_log is not None:
            self.access_log.close()
        if self.tracing is not None:
            tracing, self.tracing = self.tracing, None
            tracing.shutdown()


class Seen:
    """One inference request as the access log and tracing see it; :meth:`answered` once."""

    __slots__ = ("_obs", "protocol", "model", "version", "received", "trace", "request_id", "tenant", "rows",
                 "_done")

    def __init__(self, obs: Observer, protocol: FrontDoor, model: str | None, version: str, received: float,
                 trace: RequestTrace | None, request_id: str | None) -> None:
        self._obs = obs
        self.protocol = protocol
        self.model = model
        self.version = version
        self.received = received
        self.trace = trace
        self.request_id = request_id
        self.tenant: str | None = None
        self.rows: int | None = None
        self._done = False

    def parsed(self, inp: InferInput, batched: bool) -> None:
        """Its body is read: the rows and id it carries; the scheduler decides next (the driver
        tells its trace when it is admitted)."""
        if inp.inputs:
            self.rows = rows_of(inp.inputs[0].shape, batched)
        self.request_id = inp.id or self.request_id
        if self.trace is not None:
            self.trace.admit()

    def answered(self, status: int | str, *, variant: str | None = None, queue_s: float | None = None,
                 reason: str | None = None) -> None:
        """Its answer: ``status`` an HTTP status or a gRPC code name. Only the first call counts."""
        if self._done:
            return
        self._done = True
        obs = self._obs
        ok = status == 200 or status == "OK"
        if obs.access_log is not None:
            obs.access_log.answered(self.protocol, self.model, status, ok, obs.clock() - self.received,
                                    version=self.version, variant=variant, queue_s=queue_s, rows=self.rows,
                                    reason=reason, request_id=self.request_id, tenant=self.tenant)
        if self.trace is not None:
            self.trace.finish(status, variant=variant, reason=reason, tenant=self.tenant, rows=self.rows)

    def http_answered(self, resp: HttpResponse, result: Any = None) -> None:
        """Its HTTP answer ``resp``; ``result``: the :class:`~gateway.driver.InferResult` it carries."""
        if resp.status == 200 and result is not None:
            self.answered(200, variant=result.variant, queue_s=result.queue_s)
        else:
            self.answered(resp.status, reason=None if resp.status == 200 else http_reason(resp))

    def stream_ended(self, reason: str | None) -> None:
        """Its streamed answer ended: whole (``reason`` None), or cut short: its client went away
        or stopped reading (499), else the engine or replica failed it (503)."""
        if reason is None:
            self.answered(200)
        else:
            client = reason in ("disconnect", "write_timeout")
            self.answered(CANCELLED_HTTP if client else 503, reason=f"stream aborted: {reason}")

    def cancelled(self) -> None:
        """Its client gave up before the answer."""
        self.answered(CANCELLED_HTTP if self.protocol == "http" else "CANCELLED", reason="cancelled by the client")


def http_reason(resp: HttpResponse) -> str | None:
    """Why an HTTP answer refused: the scheduler's reject reason, else its error message."""
    for k, v in resp.headers:
        if k.lower() == REASON_HEADER:
            return v
    try:
        return str(json.loads(resp.body)["error"])
    except (ValueError, KeyError, TypeError):
        return None
