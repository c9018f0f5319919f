"""TLS for the front door: the certificate files checked once at start, and the layer that
speaks TLS on the HTTP server's connections.

:func:`load_tls` reads a certificate chain, its key and an optional client CA, and checks
each: a file that cannot be read, is not PEM, or a key that does not match its certificate
is a :class:`~gateway.errors.ConfigError` naming the field (``tls.key_file: ...``). The
result, :class:`ServerTls`, makes the HTTP server's :class:`ssl.SSLContext` and the gRPC
server's credentials from the same bytes, so both listeners present the same certificate
and ask clients for the same CA.

:class:`TlsTransport` runs TLS inside the HTTP server's own connection (OpenSSL over memory
buffers, as asyncio's own TLS does) instead of in the event loop's server. A connection is
then counted against ``limits.max_connections`` from the moment it is accepted, and its
handshake must finish within the time its first request has (``limits.header_timeout_s``):
connections that never finish a handshake cannot pile up outside the limits.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

from gateway.errors import ConfigError
from profiles.schema import absolute_path

log = logging.getLogger("headrace.gateway")

_READ = 256 << 10  # plain text taken from OpenSSL per read call
_PLAIN_ON_TLS = (b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nConnection: close\r\n"
                 b"Content-Length: %d\r\n\r\n%s")
_PLAIN_ON_TLS_BODY = b'{"error": "this port speaks TLS: use https:// (tritonclient: ssl=True)"}'


def read_file(value: str, field: str, base_dir: Path | None) -> tuple[Path, bytes]:
    """(path, contents) of the file a path field names (a relative one is taken from
    ``base_dir``, the YAML file's folder); :class:`ConfigError` naming ``field`` when it cannot
    be read."""
    path = Path(absolute_path(value, base_dir))
    try:
        return path, path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{field}: cannot read {path}: {e.strerror or e}") from None


def _check_certificates(pem: bytes, path: Path, field: str) -> None:
    if b"-----BEGIN CERTIFICATE-----" not in pem:
        raise ConfigError(f"{field}: {path} is not a PEM certificate (no -----BEGIN CERTIFICATE----- line)")
    try:
        ssl.create_default_context().load_verify_locations(cadata=pem.decode("ascii", "replace"))
    except (ssl.SSLError, ValueError) as e:
        raise ConfigError(f"{field}: {path} is not a valid PEM certificate ({_reason(e)})") from None


def _reason(e: BaseException) -> str:
    return getattr(e, "reason", None) or str(e)


@dataclass(frozen=True)
class ServerTls:
    """A server's certificate chain and key (PEM, checked), and the CA its clients must be
    signed by (None: clients are not asked for a certificate)."""

    cert_path: Path
    key_path: Path
    cert: bytes
    key: bytes
    client_ca: bytes | None = None

    def ssl_context(self, alpn: tuple[str, ...] = ("http/1.1",)) -> ssl.SSLContext:
        """A server context: TLS 1.2 or later, no renegotiation, ``CERT_REQUIRED`` with a client CA."""
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.options |= getattr(ssl, "OP_NO_RENEGOTIATION", 0)
        ctx.load_cert_chain(self.cert_path, self.key_path, password=_no_password)
        if alpn:
            ctx.set_alpn_protocols(list(alpn))
        if self.client_ca is not None:
            ctx.load_verify_locations(cadata=self.client_ca.decode("ascii", "replace"))
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def grpc_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.client_ca,
                                           require_client_auth=self.client_ca is not None)


def _no_password() -> bytes:
    raise ValueError("the private key is encrypted")


def load_tls(cert_file: str, key_file: str, client_ca_file: str | None = None, where: str = "tls",
             base_dir: Path | None = None) -> ServerTls:
    """The files read and checked; :class:`ConfigError` names ``<where>.cert_file`` and so on."""
    cert_path, cert = read_file(cert_file, f"{where}.cert_file", base_dir)
    key_path, key = read_file(key_file, f"{where}.key_file", base_dir)
    _check_certificates(cert, cert_path, f"{where}.cert_file")
    if b"PRIVATE KEY-----" not in key:
        raise ConfigError(f"{where}.key_file: {key_path} is not a PEM private key (no -----BEGIN ... PRIVATE "
                          "KEY----- line)")
    if b"ENCRYPTED" in key:
        raise ConfigError(f"{where}.key_file: {key_path} is encrypted; give the key without a passphrase "
                          "(openssl pkey -in KEY -out PLAIN) and protect the file instead")
    ca = None
    if client_ca_file is not None:
        ca_path, ca = read_file(client_ca_file, f"{where}.client_ca_file", base_dir)
        _check_certificates(ca, ca_path, f"{where}.client_ca_file")
    tls = ServerTls(cert_path, key_path, cert, key, ca)
    try:
        tls.ssl_context()
    except (ssl.SSLError, ValueError) as e:
        why = _reason(e)
        if "MISMATCH" in str(why).upper():
            raise ConfigError(f"{where}.key_file: {key_path} is not the key of the certificate in "
                              f"{where}.cert_file ({cert_path})") from None
        raise ConfigError(f"{where}.key_file: {key_path} is not a valid PEM private key for {cert_path} "
                          f"({why})") from None
    return tls


class TlsTransport:
    """The transport an HTTP connection reads and writes through when its socket speaks TLS:
    what it writes is encrypted onto the socket's own transport (``raw``), what arrives is
    given to :meth:`decrypt`. Pausing, closing and EOF pass through to ``raw`` (closing and
    EOF send TLS's close_notify first)."""

    __slots__ = ("raw", "obj", "incoming", "outgoing", "ready", "failed")

    def __init__(self, raw: asyncio.Transport, ctx: ssl.SSLContext) -> None:
        self.raw = raw
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.obj = ctx.wrap_bio(self.incoming, self.outgoing, server_side=True)
        self.ready = False  # the handshake is done
        self.failed = False

    def decrypt(self, data: bytes) -> bytes:
        """The plain text ``data`` completes (b"" during the handshake or within a record).
        A client that does not speak TLS, or whose certificate is refused, is answered (a
        plain-text 400, or TLS's alert) and closed; it gets b"" here and nothing more."""
        if self.failed:
            return b""
        self.incoming.write(data)
        try:
            if not self.ready:
                try:
                    self.obj.do_handshake()
                except ssl.SSLWantReadError:
                    self._flush()
                    return b""
                self.ready = True
            chunks = []
            while True:
                try:
                    chunk = self.obj.read(_READ)
                except ssl.SSLWantReadError:
                    break
                except ssl.SSLZeroReturnError:
                    chunk = b""
                if not chunk:  # close_notify: the client is done; answer it in kind and close, as on EOF
                    self.close()
                    self.failed = True
                    return b""
                chunks.append(chunk)
        except ssl.SSLError as e:
            self._fail(e)
            return b""
        self._flush()  # what OpenSSL answers on its own: handshake records, session tickets
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _fail(self, e: ssl.SSLError) -> None:
        self.failed = True
        if not self.ready and e.reason == "HTTP_REQUEST":  # plain HTTP on a TLS port: say so in plain HTTP
            self.raw.write(_PLAIN_ON_TLS % (len(_PLAIN_ON_TLS_BODY), _PLAIN_ON_TLS_BODY))
        else:
            self._flush()  # the alert that tells the client why
        log.debug("TLS connection from %s refused: %s", self.raw.get_extra_info("peername"), e)
        self.raw.close()

    def _flush(self) -> None:
        if self.outgoing.pending:
            self.raw.write(self.outgoing.read())

    # ---- the asyncio.Transport methods the HTTP connection uses
    def write(self, data: bytes) -> None:
        if self.failed or self.raw.is_closing():
            return
        view, done = memoryview(data), 0
        try:
            while done < len(view):
                done += self.obj.write(view[done:])
        except ssl.SSLError as e:
            self._fail(e)
            return
        self._flush()

    def _close_notify(self) -> None:
        if self.ready and not self.failed:
            try:
                self.obj.unwrap()
            except ssl.SSLError:
                pass  # it waits for the client's close_notify; ours is written already
            self._flush()

    def close(self) -> None:
        if not self.raw.is_closing():
            self._close_notify()
        self.raw.close()

    def can_write_eof(self) -> bool:
        return self.raw.can_write_eof()

    def write_eof(self) -> None:
        self._close_notify()
        self.raw.write_eof()

    def is_closing(self) -> bool:
        return self.raw.is_closing()

    def pause_reading(self) -> None:
        self.raw.pause_reading()

    def resume_reading(self) -> None:
        self.raw.resume_reading()

    def get_extra_info(self, name: str, default: object = None) -> object:
        if name == "ssl_object":
            return self.obj
        if name == "peercert":
            return self.obj.getpeercert() if self.ready else default
        return self.raw.get_extra_info(name, default)
