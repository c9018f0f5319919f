"""What the HTTP front door accepts before it refuses: connections, request heads, time, buffers.

:class:`Limits` holds :class:`~profiles.schema.LimitsSpec` (and ``max_message_bytes``) as
plain numbers that :mod:`gateway.frontdoor.httpserver` compares on its parse callbacks. Each refusal
is a :class:`Refusal` whose message names the limit and its value. :func:`ensure_fd_room`
makes the process's open-file limit fit the connection cap.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass

from profiles.schema import LimitsSpec

log = logging.getLogger("headrace.gateway")

PROBE_PREFIX = b"/v2/health/"  # what a connection in the probe room may ask for
LINGER_S = 2.0  # after a refusal, how long what the client still sends is read and dropped
FD_RESERVE = 256  # open files besides client connections: listeners, replica channels, logs


class Refusal(Exception):
    """A request refused by a limit: answered ``status`` with ``{"error": message}`` (and
    ``Retry-After`` when the refusal is temporary), then its connection closes."""

    def __init__(self, status: int, message: str, retry_after: int | None = None,
                 headers: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after
        self.headers = headers  # answered with these too (e.g. WWW-Authenticate on a 401)


@dataclass(frozen=True, slots=True)
class Limits:
    """The front door's limits as plain numbers (see :class:`~profiles.schema.LimitsSpec`)."""

    max_body: int  # max_message_bytes
    max_connections: int
    probe_connections: int
    max_header_bytes: int
    max_headers: int
    max_url_bytes: int
    header_timeout_s: float
    body_timeout_s: float
    idle_timeout_s: float
    max_buffered_bytes: int
    max_address_connections: int
    max_client_buffered_bytes: int

    @classmethod
    def of(cls, spec: LimitsSpec | None, max_body: int) -> Limits:
        s = spec or LimitsSpec()
        return cls(max_body, s.max_connections, s.probe_connections, s.max_header_bytes, s.max_headers,
                   s.max_url_bytes, s.header_timeout_s, s.body_timeout_s, s.idle_timeout_s,
                   s.max_buffered_bytes, s.max_address_connections, s.max_client_buffered_bytes)

    # ---- refusals, each naming its limit
    def url_too_long(self) -> Refusal:
        return Refusal(414, f"request URL exceeds limits.max_url_bytes ({self.max_url_bytes} bytes)")

    def head_too_large(self) -> Refusal:
        return Refusal(431, f"request line and headers exceed limits.max_header_bytes ({self.max_header_bytes} bytes)")

    def too_many_headers(self) -> Refusal:
        return Refusal(431, f"request has more than limits.max_headers ({self.max_headers}) headers")

    def body_too_large(self) -> Refusal:
        return Refusal(413, f"request body exceeds {self.max_body} bytes (max_message_bytes)")

    def buffers_full(self) -> Refusal:
        return Refusal(503, "request bodies being received would exceed limits.max_buffered_bytes "
                       f"({self.max_buffered_bytes} bytes); retry later", retry_after=1)

    def client_buffers_full(self) -> Refusal:
        return Refusal(429, "this client's request bytes being received or waiting on its connections would "
                       f"exceed limits.max_client_buffered_bytes ({self.max_client_buffered_bytes} bytes); "
                       "retry later", retry_after=1)

    def probes_only(self) -> Refusal:
        return Refusal(503, f"the gateway is at limits.max_connections ({self.max_connections}); this "
                       f"connection may only ask for {PROBE_PREFIX.decode()}*; retry later", retry_after=1)

    def head_timed_out(self) -> Refusal:
        return Refusal(408, f"request headers not received within limits.header_timeout_s ({self.header_timeout_s:g} s)")

    def body_timed_out(self) -> Refusal:
        return Refusal(408, f"request body not received within limits.body_timeout_s ({self.body_timeout_s:g} s)")


def ensure_fd_room(limits: Limits, others: int = 0) -> None:
    """Raise the soft open-file limit (up to the hard one) so the connection cap can be reached
    while the process's other listeners hold ``others`` connections (the gRPC port's cap, the
    metrics listener's): past the open-file limit, accepting fails for every client, health
    probes included."""
    need = limits.max_connections + limits.probe_connections + others + FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as e:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, target, e)
    if soft < need:
        log.warning("open-file limit %d is below limits.max_connections + probe_connections + the other "
                    "listeners' %d + %d (%d): past about %d connections new ones fail, health probes "
                    "included; lower max_connections or grpc_max_connections or raise the limit (ulimit -n)",
                    soft, others, FD_RESERVE, need, soft - FD_RESERVE)
