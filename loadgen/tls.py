"""What a secured front door asks of the load generator: TLS (an HTTPS context, or gRPC
channel credentials, from the same CA and client certificate files) and an API key per model,
sent as ``Authorization: Bearer KEY`` (an HTTP header, gRPC metadata), as the gateway's
tenants expect (``gateway/frontdoor/security.py``)."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

from loadgen.spec import LoadSpec


class TlsFileError(ValueError):
    """A certificate or key file cannot be used; the message names the option and file."""


def _read(path: Path, option: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise TlsFileError(f"{option} {path}: cannot read ({e.strerror or e})") from None


def ssl_context(spec: LoadSpec) -> ssl.SSLContext | None:
    """The client context for HTTPS (None without TLS): the system's trust store or
    ``ca_file``, the hostname checked, and the client certificate for mutual TLS."""
    if not spec.secure:
        return None
    try:
        ctx = ssl.create_default_context(cafile=str(spec.ca_file) if spec.ca_file else None)
    except (OSError, ssl.SSLError) as e:
        raise TlsFileError(f"--ca-file {spec.ca_file}: not a usable PEM CA bundle ({e})") from None
    ctx.set_alpn_protocols(["http/1.1"])
    if spec.client_cert is not None:
        try:
            ctx.load_cert_chain(str(spec.client_cert), str(spec.client_key))
        except (OSError, ssl.SSLError) as e:
            raise TlsFileError(
                f"--client-cert {spec.client_cert} / --client-key {spec.client_key}: not a "
                f"matching PEM certificate and key ({e})"
            ) from None
    return ctx


def grpc_credentials(spec: LoadSpec) -> Any:
    """``grpc.ssl_channel_credentials`` from the same files (None without TLS)."""
    if not spec.secure:
        return None
    import grpc

    root = _read(spec.ca_file, "--ca-file") if spec.ca_file else None
    cert = _read(spec.client_cert, "--client-cert") if spec.client_cert else None
    key = _read(spec.client_key, "--client-key") if spec.client_key else None
    return grpc.ssl_channel_credentials(root_certificates=root, private_key=key,
                                        certificate_chain=cert)  # fmt: skip


def auth_pairs(key: str | None) -> tuple[tuple[str, str], ...]:
    """The header (HTTP) or metadata (gRPC, lower-case) that carries ``key``."""
    return () if key is None else (("authorization", f"Bearer {key}"),)
