"""Who may call the gateway: tenants, their API keys, priority classes and rate quotas.

A tenant's keys are named in the config by where they are kept (an environment variable, a
file) or by their SHA-256 digest; :func:`load_tenants` reads them once at start (a variable
that is unset, a file that cannot be read: :class:`~gateway.errors.ConfigError` naming the
field) and keeps only digests. :meth:`Tenants.identify` hashes the key a request presents and
finds its tenant with one dict lookup, confirmed with :func:`hmac.compare_digest`; no key is
ever kept in plain text or logged.

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


def tenant_of(spec: TenantSpec) -> Tenant:
    q = spec.quota
    priority = _PRIORITY[spec.priority] if spec.priority else None
    if q is None:
        return Tenant(spec.name, priority)
    return Tenant(spec.name, priority, q.rate, q.burst or max(1, math.ceil(q.rate)))


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


def key_digest(spec: ApiKeySpec, where: str, base_dir: Path | None = None,
               environ: Mapping[str, str] = os.environ) -> bytes:
    """The SHA-256 digest of one configured key; :class:`ConfigError` naming ``where`` when
    its variable is unset or empty, or its file cannot be read or is empty."""
    if spec.sha256 is not None:
        return bytes.fromhex(spec.sha256)
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
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


def load_tenants(specs: list[TenantSpec], where: str = "tenants", base_dir: Path | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 environ: Mapping[str, str] = os.environ) -> Tenants | None:
    """The tenants with their keys read (None: no tenant, every call is open). A key given
    twice is a :class:`ConfigError` naming both places (never the key)."""
    if not specs:
        return None
    by_digest: dict[bytes, Tenant] = {}
    seen: dict[bytes, str] = {}
    for i, spec in enumerate(specs):
        tenant = tenant_of(spec)
        if tenant.name == UNAUTHENTICATED:
            raise ConfigError(f"{where}.{i}.name: {UNAUTHENTICATED!r} is reserved")
        for j, key in enumerate(spec.keys):
            here = f"{where}.{i}.keys.{j}"
            digest = key_digest(key, here, base_dir, environ)
            if digest in seen:
                raise ConfigError(f"{here}: the same key as {seen[digest]}; a key identifies one tenant")
            seen[digest] = here
            by_digest[digest] = tenant
    return Tenants(by_digest, clock)


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
