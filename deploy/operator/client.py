"""The operator's admin API from the command side: one call to a running controller, how its
HTTPS certificate is verified, and :class:`CliError`, the error a command reports (one line on
stderr) with the exit code it exits with."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from typing import Any

ADMIN_CA_ENV = "HEADRACE_ADMIN_CA"


class CliError(Exception):
    """What a command reports; ``code`` is its exit code (2: the input is wrong, 1: the rest)."""

    def __init__(self, msg: str, code: int = 1) -> None:
        super().__init__(msg)
        self.code = code


def admin_context(ca_file: str | None, recorded_cert: str | None = None) -> ssl.SSLContext:
    """How an HTTPS admin API is verified: with ``ca_file`` (--admin-ca, $HEADRACE_ADMIN_CA);
    else with the certificate ``up`` recorded (that certificate itself is trusted, so a
    self-signed one works on the controller's host); else with the system's CAs."""
    try:
        if ca_file:
            return ssl.create_default_context(cafile=ca_file)
        if recorded_cert:
            ctx = ssl.create_default_context(cafile=recorded_cert)
            ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
            return ctx
    except (OSError, ssl.SSLError) as e:
        what = f"--admin-ca {ca_file}" if ca_file else f"the admin certificate {recorded_cert} in the state"
        raise CliError(f"{what}: cannot load it: {getattr(e, 'strerror', None) or e}", 2) from None
    return ssl.create_default_context()


def call(url: str, token: str, method: str, path: str, body: bytes | None = None,
         timeout: float = 600.0, context: ssl.SSLContext | None = None) -> Any:
    """One admin call; ``context`` verifies an HTTPS admin API (None: the system's CAs)."""
    req = urllib.request.Request(url + path, data=body, method=method,
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/yaml"})
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as r:
            data = r.read()
            return json.loads(data) if r.headers.get_content_type() == "application/json" else data.decode()
    except urllib.error.HTTPError as e:
        try:
            msg = json.loads(e.read()).get("error", "")
        except ValueError:
            msg = e.reason
        raise CliError(f"{e.code}: {msg}", 2 if e.code in (400, 401, 409, 422) else 1) from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        if isinstance(reason, ssl.SSLCertVerificationError):
            raise CliError(f"cannot verify the controller at {url}: {reason.verify_message}; give the CA that "
                           f"signed its certificate with --admin-ca or ${ADMIN_CA_ENV}", 2) from None
        raise CliError(f"cannot reach the controller at {url}: {e}", 1) from None
