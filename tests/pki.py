"""Throw-away certificates for TLS tests, made with the ``openssl`` command line: a CA, a
server certificate for 127.0.0.1 and localhost, a client certificate, and a client
certificate from another CA (one the gateway must refuse)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

OPENSSL = "openssl"
_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA certificate clients and the gateway trust
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path  # a client certificate another CA signed
    stranger_key: Path

    def read(self, name: str) -> bytes:
        return getattr(self, name).read_bytes()


def _run(*args: str, cwd: Path) -> None:
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def _ca(d: Path, name: str) -> None:
    _run("req", "-x509", *_EC, "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2",
         "-subj", f"/CN=headrace test {name}", "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)


def _leaf(d: Path, name: str, ca: str, cn: str, ext: str) -> None:
    (d / f"{name}.ext").write_text(ext)
    _run("req", *_EC, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=d)
    _run("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
         "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)


def make_pki(d: Path) -> Pki:
    """Every file written into ``d``; about 0.2 s."""
    d.mkdir(parents=True, exist_ok=True)
    _ca(d, "ca")
    _ca(d, "other-ca")
    _leaf(d, "server", "ca", "localhost", "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
          "extendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n")
    client = "extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n"
    _leaf(d, "client", "ca", "tenant-a", client)
    _leaf(d, "stranger", "other-ca", "stranger", client)
    return Pki(d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem", d / "client.key",
               d / "stranger.pem", d / "stranger.key")
