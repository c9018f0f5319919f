"""Who may call the gateway: tenants, their API keys, priority classes and rate quotas.

A tenant's keys are named in the config by where they are kept (an environment variable, a
file, an open file descriptor) or by their SHA-256 digest; :func:`load_tenants` reads them once
at start (a variable that is unset, a file or descriptor that cannot be read:
:class:`~gateway.errors.ConfigError` naming the field) and keeps only digests.
:meth:`Tenants.identify` hashes the key a request presents and finds its tenant with one dict
lookup, confirmed with :func:`hmac.compare_digest`; no key is ever kept in plain text or logged.

Where a key can still be read is the operator's choice: a variable stays in the process's
``/proc/PID/environ``, readable by the same user (and root) for the process's life, whatever
the process later does to ``os.environ``; a file stays on disk; a descriptor (``fd: 3`` with
``headrace serve ... 3< <(vault read ...)``) is read to its first line, or its end, and is
gone. A descriptor is read once per process: a later load in the same process (the operator
checks its Gateway document, then serves it) reuses the digest it gave.
``headrace serve --workers N`` reads every key in the parent and hands the workers digests
(:func:`with_key_digests`), so a worker the parent starts again needs neither the variable, the
file nor the descriptor, and every worker admits the keys the parent read.

``/metrics`` on the main port shows every tenant's names and counts, so once tenants are
configured only a tenant with ``metrics: true`` (the scraper's or an operator's key) may read
it there; another tenant's key gets 403 (:class:`~gateway.errors.Forbidden`). The metrics
listener (``metrics_listen``) is the scraper's and asks no key.

A tenant's quota is a :class:`TokenBucket` over its inference requests: ``burst`` of them at
once, refilled at ``rate`` per second. Past it, :meth:`Tenants.admit` raises a
:class:`~gateway.errors.Rejected` with reason ``quota`` and the wait until the next token.

The front doors map these to their protocols: the key comes from ``Authorization: Bearer
KEY`` or ``x-api-key: KEY`` (HTTP headers, gRPC metadata), a missing or unknown one is
:class:`~gateway.errors.Unauthenticated`, and health probes never ask for one.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.errors import ConfigError, Rejected, Unauthenticated
from gateway.frontdoor.tls import ServerTls, load_tls, read_file
from gateway.policy.types import Priority
from profiles.schema import UNAUTHENTICATED, ApiKeySpec, GatewaySettings, TenantSpec

QUOTA = "quota"  # the reject reason (x-headrace-reject-reason) of a request over its tenant's quota
OPEN_HTTP_PATHS = frozenset({"/v2/health/live", "/v2/health/ready"})  # answered without a key
OPEN_GRPC_METHODS = frozenset({"ServerLive", "ServerReady"})
_PRIORITY = {"guaranteed": Priority.GUARANTEED, "best-effort": Priority.BEST_EFFORT}


class TokenBucket:
    """``burst`` tokens, refilled at ``rate`` per second; a request takes one. The clock is
    the caller's: :meth:`take` is given ``now``."""

    __slots__ = ("rate", "burst", "tokens", "at")

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.tokens = float(burst)  # a new bucket is full
        self.at = now

    def take(self, now: float) -> float:
        """0.0 when a token was taken; else the seconds until one will be there (nothing taken)."""
        if now > self.at:
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
            self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    priority: Priority | None  # None: the request's own priority parameter decides
    rate: float | None = None  # quota: inference requests per second (None: no quota)
    burst: int = 0  # quota: requests at once
    metrics: bool = False  # may read /metrics on the main port (every tenant's series)


def tenant_of(spec: TenantSpec) -> Tenant:
    q = spec.quota
    priority = _PRIORITY[spec.priority] if spec.priority else None
    if q is None:
        return Tenant(spec.name, priority, metrics=spec.metrics)
    return Tenant(spec.name, priority, q.rate, q.burst or max(1, math.ceil(q.rate)), spec.metrics)


@dataclass
class Tenants:
    """The configured tenants by the SHA-256 digest of each of their keys."""

    by_digest: dict[bytes, Tenant]
    clock: Callable[[], float] = time.monotonic
    buckets: dict[str, TokenBucket] = field(default_factory=dict)
    _lookup: dict[bytes, tuple[bytes, Tenant]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._lookup = {d: (d, t) for d, t in self.by_digest.items()}
        now = self.clock()
        for t in self.by_digest.values():
            if t.rate is not None and t.name not in self.buckets:
                self.buckets[t.name] = TokenBucket(t.rate, t.burst, now)

    def identify(self, key: str | None) -> Tenant:
        """The tenant whose key ``key`` is; :class:`Unauthenticated` when it is missing or unknown."""
        if not key:
            raise Unauthenticated("missing API key: send Authorization: Bearer <key> or x-api-key: <key>")
        digest = hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()
        stored, tenant = self._lookup.get(digest, (b"", None))
        # the dict finds the candidate; the constant-time comparison is what admits it
        if tenant is None or not hmac.compare_digest(digest, stored):
            raise Unauthenticated("unknown API key")
        return tenant

    def admit(self, tenant: Tenant) -> None:
        """Take one of ``tenant``'s quota tokens; :class:`Rejected` (``quota``) when there is none."""
        bucket = self.buckets.get(tenant.name)
        if bucket is None:
            return
        wait = bucket.take(self.clock())
        if wait > 0.0:
            raise Rejected(f"tenant '{tenant.name}' is over its quota ({tenant.rate:g} requests/s, burst "
                           f"{tenant.burst}); retry in {wait:.3g} s", QUOTA, wait)

    @property
    def names(self) -> list[str]:
        return sorted({t.name for t in self.by_digest.values()})


def bearer_key(authorization: str | None, api_key: str | None) -> str | None:
    """The key a request presents: ``Authorization: Bearer KEY`` (the scheme in any case),
    else ``x-api-key: KEY``; None when neither is given."""
    if authorization:
        scheme, _, key = authorization.strip().partition(" ")
        if scheme.lower() == "bearer" and key.strip():
            return key.strip()
    return api_key.strip() if api_key else None


def grpc_key(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    """:func:`bearer_key` from gRPC metadata (``authorization``, ``x-api-key``)."""
    auth = api = None
    for k, v in metadata or ():
        if k == "authorization":
            auth = v if isinstance(v, str) else v.decode("latin-1")
        elif k == "x-api-key":
            api = v if isinstance(v, str) else v.decode("latin-1")
    return bearer_key(auth, api)


MAX_KEY_BYTES = 64 << 10  # what a key file or descriptor may hold
# (fd, st_dev, st_ino) -> the digest its key gave: a descriptor is read once per process
_FD_DIGESTS: dict[tuple[int, int, int], bytes] = {}


def key_digest(spec: ApiKeySpec, where: str, base_dir: Path | None = None,
               environ: Mapping[str, str] = os.environ) -> bytes:
    """The SHA-256 digest of one configured key; :class:`ConfigError` naming ``where`` when
    its variable is unset or empty, or its file or descriptor cannot be read or is empty."""
    if spec.sha256 is not None:
        return bytes.fromhex(spec.sha256)
    if spec.fd is not None:
        return fd_key_digest(spec.fd, f"{where}.fd")
    if spec.env is not None:
        key = environ.get(spec.env, "").strip()
        if not key:
            raise ConfigError(f"{where}.env: environment variable {spec.env} is "
                              f"{'empty' if spec.env in environ else 'not set'}")
    else:
        path, raw = read_file(spec.file, f"{where}.file", base_dir)  # type: ignore[arg-type]
        key = raw.decode("utf-8", "surrogateescape").strip()
        if not key:
            raise ConfigError(f"{where}.file: {path} is empty")
    return _digest(key)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


def fd_key_digest(fd: int, where: str) -> bytes:
    """The digest of the key open descriptor ``fd`` gives: its first line (surrounding
    whitespace dropped), read up to that line's end or the descriptor's end, once per process
    (a later call for the same open file reuses the digest). :class:`ConfigError` naming
    ``where`` when it is not open, cannot be read, or gives no key."""
    try:
        st = os.fstat(fd)
    except OSError as e:
        raise ConfigError(f"{where}: file descriptor {fd} is not open ({e.strerror})") from None
    ident = (fd, st.st_dev, st.st_ino)
    known = _FD_DIGESTS.get(ident)
    if known is not None:
        return known
    raw = bytearray()
    try:
        while b"\n" not in raw.lstrip() and len(raw) <= MAX_KEY_BYTES:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            raw += chunk
    except OSError as e:
        raise ConfigError(f"{where}: cannot read file descriptor {fd} ({e.strerror})") from None
    line = bytes(raw).lstrip().split(b"\n", 1)[0]
    if len(line) > MAX_KEY_BYTES:
        raise ConfigError(f"{where}: file descriptor {fd} gives more than {MAX_KEY_BYTES} bytes on a line")
    key = line.decode("utf-8", "surrogateescape").strip()
    if not key:
        raise ConfigError(f"{where}: file descriptor {fd} gives no key (empty, or already read to its end)")
    digest = _FD_DIGESTS[ident] = _digest(key)
    return digest


def tenant_digests(specs: list[TenantSpec], where: str = "tenants", base_dir: Path | None = None,
                   environ: Mapping[str, str] = os.environ) -> list[list[bytes]]:
    """Each tenant's key digests, read now; a key given twice is a :class:`ConfigError` naming
    both places (never the key)."""
    out: list[list[bytes]] = []
    seen: dict[bytes, str] = {}
    for i, spec in enumerate(specs):
        if spec.name == UNAUTHENTICATED:
            raise ConfigError(f"{where}.{i}.name: {UNAUTHENTICATED!r} is reserved")
        digests = []
        for j, key in enumerate(spec.keys):
            here = f"{where}.{i}.keys.{j}"
            digest = key_digest(key, here, base_dir, environ)
            if digest in seen:
                raise ConfigError(f"{here}: the same key as {seen[digest]}; a key identifies one tenant")
            seen[digest] = here
            digests.append(digest)
        out.append(digests)
    return out


def load_tenants(specs: list[TenantSpec], where: str = "tenants", base_dir: Path | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 environ: Mapping[str, str] = os.environ) -> Tenants | None:
    """The tenants with their keys read (None: no tenant, every call is open); see
    :func:`tenant_digests` for the errors."""
    if not specs:
        return None
    by_digest: dict[bytes, Tenant] = {}
    for spec, digests in zip(specs, tenant_digests(specs, where, base_dir, environ), strict=True):
        tenant = tenant_of(spec)
        for digest in digests:
            by_digest[digest] = tenant
    return Tenants(by_digest, clock)


def with_key_digests(doc: dict[str, Any], settings: GatewaySettings, base_dir: Path | None = None,
                     environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """``doc`` (a serve config as read from its YAML, ``settings`` its validated form) with
    every tenant key read now and given by its digest (``{sha256: ...}``): what ``headrace
    serve --workers N`` hands its workers, so a worker started again later reads no variable,
    file or descriptor (a descriptor could not be read twice) and every worker admits the keys
    the parent read. :class:`ConfigError` as :func:`tenant_digests`."""
    if not settings.tenants:
        return doc
    digests = tenant_digests(settings.tenants, "tenants", base_dir, environ)
    tenants = [{**raw, "keys": [{"sha256": d.hex()} for d in ds]}
               for raw, ds in zip(doc["tenants"], digests, strict=True)]
    return {**doc, "tenants": tenants}


@dataclass(frozen=True)
class Security:
    """What the front door's settings ask for, read and checked: TLS and the tenants."""

    tls: ServerTls | None
    tenants: Tenants | None


def load_security(settings: GatewaySettings, prefix: str = "", base_dir: Path | None = None,
                  clock: Callable[[], float] = time.monotonic,
                  environ: Mapping[str, str] = os.environ) -> Security:
    """``settings.tls`` and ``settings.tenants`` loaded; a :class:`ConfigError` names the field
    (``prefix`` goes before its path, e.g. ``"spec."`` for a Gateway document)."""
    t = settings.tls
    tls = None if t is None else load_tls(t.cert_file, t.key_file, t.client_ca_file, f"{prefix}tls", base_dir)
    return Security(tls, load_tenants(settings.tenants, f"{prefix}tenants", base_dir, clock, environ))
