"""TLS from the gateway to Triton: a replica's ``tls:`` settings, read and checked at start,
as the credentials of the gRPC channel and the :class:`ssl.SSLContext` of the HTTP client.

Triton's gRPC endpoint speaks TLS itself (``--grpc-use-ssl``, with ``--grpc-use-ssl-mutual``
for client certificates); its HTTP endpoint does not, so HTTPS to Triton means a TLS proxy in
front of it (or another headrace gateway). The certificate is verified against ``ca_file``
(default: the system's CAs) and the url's host, or ``server_name`` when set.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

from gateway.errors import ConfigError
from gateway.frontdoor.tls import read_file


@dataclass(frozen=True)
class BackendTls:
    ca: bytes | None  # PEM CA bundle; None: the system's
    cert_path: Path | None  # client certificate (mutual TLS)
    key_path: Path | None
    cert: bytes | None
    key: bytes | None
    server_name: str | None  # verified instead of the url's host

    def grpc_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                            certificate_chain=self.cert)

    def grpc_options(self) -> list[tuple[str, str]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cadata=self.ca.decode("ascii", "replace") if self.ca else None)
        if self.cert_path is not None and self.key_path is not None:
            ctx.load_cert_chain(self.cert_path, self.key_path)
        return ctx


def load_backend_tls(ca_file: str | None, cert_file: str | None, key_file: str | None,
                     server_name: str | None, where: str, base_dir: Path | None) -> BackendTls:
    """The files read and checked; :class:`ConfigError` names ``<where>.ca_file`` and so on."""
    ca = read_file(ca_file, f"{where}.ca_file", base_dir)[1] if ca_file else None
    cert_path = key_path = cert = key = None
    if cert_file and key_file:
        cert_path, cert = read_file(cert_file, f"{where}.cert_file", base_dir)
        key_path, key = read_file(key_file, f"{where}.key_file", base_dir)
    tls = BackendTls(ca, cert_path, key_path, cert, key, server_name)
    try:
        tls.ssl_context()
    except (ssl.SSLError, ValueError) as e:
        raise ConfigError(f"{where}: the CA, certificate or key is not valid PEM "
                          f"({getattr(e, 'reason', None) or e})") from None
    return tls
