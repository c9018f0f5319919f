"""Domain errors of the gateway. Each names the answer it becomes (its ``http_status`` and
``grpc_code``); the front doors map them at the edge, and only there:
:func:`gateway.frontdoor.http._error` (the HTTP error response) and
:func:`gateway.frontdoor.grpc._abort` (the gRPC abort), each adding a refusal's reason and
``Retry-After``."""

from __future__ import annotations

import os
import re

import grpc

from gateway.policy.types import RejectReason


class ConfigError(ValueError):
    """A configuration is invalid (a YAML field, a file it names, a command-line value); the
    message names the field and the value. Raised at start, never answered to a client."""


class GatewayError(Exception):
    """Base class; ``str(err)`` is the message returned to the client."""

    http_status = 500
    grpc_code = grpc.StatusCode.INTERNAL


class InvalidRequest(GatewayError):
    """The request is malformed or does not match the model's inputs."""

    http_status = 400
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT


class Unauthenticated(GatewayError):
    """The request carries no API key, or one no tenant has (HTTP answers carry
    ``WWW-Authenticate: Bearer``). The message never repeats the key."""

    http_status = 401
    grpc_code = grpc.StatusCode.UNAUTHENTICATED


class Forbidden(GatewayError):
    """The request's key is valid but its tenant may not make this call (``/metrics`` on the
    main port for a tenant without ``metrics: true``)."""

    http_status = 403
    grpc_code = grpc.StatusCode.PERMISSION_DENIED


class ModelNotFound(GatewayError):
    http_status = 404
    grpc_code = grpc.StatusCode.NOT_FOUND


REASON_HEADER = "x-headrace-reject-reason"  # on every refusal: RejectReason's value, or "quota"


class Rejected(GatewayError):
    """Answered early: the request cannot finish within its deadline (or was shed, or its
    tenant is over its quota). The reason travels as :data:`REASON_HEADER` (HTTP header, gRPC
    trailing metadata), so a client can tell a refusal at arrival from a request that expired
    in the queue; the wait it suggests travels as ``Retry-After``. Make one with
    :func:`rejection`."""

    http_status = 429
    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED

    def __init__(self, message: str, reason: str, retry_after: float) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after = retry_after


class NoReplica(Rejected):
    """Refused because no healthy replica serves the model: unavailability, not overload, so
    503 / UNAVAILABLE (which Triton and KServe clients retry), with the same reason header."""

    http_status = 503
    grpc_code = grpc.StatusCode.UNAVAILABLE


def rejection(message: str, reason: str, retry_after: float) -> Rejected:
    """The error answering a refusal of the core: :class:`NoReplica` for ``no_replica``, else
    :class:`Rejected` (429 / RESOURCE_EXHAUSTED)."""
    cls = NoReplica if reason == RejectReason.NO_REPLICA else Rejected
    return cls(message or f"request rejected: {reason}", reason, retry_after)


class Unavailable(GatewayError):
    """No replica could serve the request (all down, failed batch, or the gateway drains)."""

    http_status = 503
    grpc_code = grpc.StatusCode.UNAVAILABLE


class BackendError(GatewayError):
    """A replica answered with an error, or could not be reached (``retryable``: another
    replica may well succeed). The message is what the client reads, so it never names the
    backend's address: the replica clients say which variant failed and how, with
    :func:`transport_text` for a connection's failure and :func:`hide_address` over what
    Triton said; the driver adds the replica's id (:meth:`at`). The address goes to the
    gateway's own log only."""

    def __init__(self, message: str, code: grpc.StatusCode, retryable: bool) -> None:
        super().__init__(message)
        self.grpc_code = code
        self.retryable = retryable
        self.http_status = _HTTP_OF_GRPC.get(code, 500)

    def at(self, replica: str) -> BackendError:
        """This error, its message naming the replica (by id) it came from (itself when it
        names it already)."""
        if str(self).startswith(f"replica {replica}: "):
            return self
        return BackendError(f"replica {replica}: {self}", self.grpc_code, self.retryable)


def transport_text(e: BaseException) -> str:
    """What went wrong with a connection, without the address the exception's text may carry
    (``Connect call failed ('10.0.0.5', 8001)``): its type, and for an ``OSError`` with an
    errno the system's words for it."""
    if isinstance(e, OSError) and e.errno:
        return f"{type(e).__name__}: {os.strerror(e.errno)}"
    return type(e).__name__


# an IPv4 or [IPv6] address with its port, as Python and gRPC (ipv4:, ipv6:%5B...%5D) write them
_HOST_PORT = re.compile(r"(?:ipv[46]:)?(?:\d{1,3}(?:\.\d{1,3}){3}|\[[\w:.%]+\]|%5B[\w:.%]+?%5D):\d{1,5}")


def hide_address(text: str, url: str) -> str:
    """``text`` (a backend's error message) with ``url`` (``host:port``), its host and any
    ``IP:port`` replaced by ``<replica>``: an address never reaches a client."""
    text = _HOST_PORT.sub("<replica>", text).replace(url, "<replica>")
    host = url.rpartition(":")[0]
    if not host:
        return text
    return re.sub(rf"(?<![\w.-]){re.escape(host)}(?![\w-])", "<replica>", text)


_HTTP_OF_GRPC = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.UNIMPLEMENTED: 501,
}
