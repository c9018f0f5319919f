"""Tenants, their keys and quotas, and the certificate files, without a network: keys are
read from where the config names them and kept only as digests; a missing or wrong key is
Unauthenticated; a quota is a token bucket on an injected clock; every bad setting is a
ConfigError naming its field, and no error ever repeats a key."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.errors import ConfigError, Rejected, Unauthenticated
from gateway.frontdoor.security import (
    QUOTA,
    TokenBucket,
    bearer_key,
    grpc_key,
    load_security,
    load_tenants,
)
from gateway.frontdoor.tls import load_tls
from gateway.policy.types import Priority
from profiles.schema import ApiKeySpec, GatewaySettings, TenantSpec
from tests.pki import make_pki

KEY_A = "ka-7f3c0d9e1b2a4c6d8e0f"
KEY_B = "kb-0a1b2c3d4e5f60718293"


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def tenants_of(*specs: dict, clock: Clock | None = None, environ: dict | None = None, base_dir: Path | None = None):
    return load_tenants([TenantSpec.model_validate(s) for s in specs], base_dir=base_dir,
                        clock=clock or Clock(), environ=environ or {})


# --------------------------------------------------------------------------- the token bucket


def test_a_bucket_admits_its_burst_at_once_then_its_rate():
    b = TokenBucket(rate=2.0, burst=3, now=0.0)
    assert [b.take(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert b.take(0.0) == pytest.approx(0.5)  # the next token comes in 1/rate
    assert b.take(0.25) == pytest.approx(0.25)  # a refusal takes nothing
    assert b.take(0.5) == 0.0
    # NOTE: a quiet spell refills at most to the burst, never beyond
    assert [b.take(100.0) for _ in range(4)][:3] == [0.0, 0.0, 0.0]
    assert b.take(100.0) > 0


def test_a_bucket_over_a_long_run_admits_rate_times_time_plus_burst():
    b = TokenBucket(rate=10.0, burst=5, now=0.0)
    admitted = sum(b.take(i * 0.001) == 0.0 for i in range(10_000))  # 1000 req/s for 10 s
    assert admitted == pytest.approx(10.0 * 10 + 5, abs=1)


# --------------------------------------------------------------------------- keys and tenants


def test_keys_come_from_an_env_var_a_file_or_a_digest_and_each_names_its_tenant(tmp_path):
    (tmp_path / "b.key").write_text(f"  {KEY_B}\n")
    t = tenants_of({"name": "a", "keys": [{"env": "KEY_A"}], "priority": "best-effort"},
                   {"name": "b", "keys": [{"file": "b.key"}, {"sha256": sha("rotated-b")}]},
                   environ={"KEY_A": KEY_A}, base_dir=tmp_path)
    a, b = t.identify(KEY_A), t.identify(KEY_B)
    assert (a.name, a.priority) == ("a", Priority.BEST_EFFORT)
    assert (b.name, b.priority) == ("b", None)  # NOTE: no class set: the request's own priority stays in force
    assert t.identify("rotated-b") is b
    assert t.names == ["a", "b"]


@pytest.mark.parametrize("key", [None, "", "wrong", KEY_A + "x", KEY_A[:-1], sha(KEY_A)])
def test_a_missing_or_wrong_key_is_unauthenticated_and_the_error_never_repeats_it(key):
    t = tenants_of({"name": "a", "keys": [{"sha256": sha(KEY_A)}]})
    with pytest.raises(Unauthenticated) as e:
        t.identify(key)
    msg = str(e.value)
    assert msg.startswith("missing API key" if not key else "unknown API key")
    assert not key or key not in msg


def test_no_tenants_means_no_authentication():
    assert load_tenants([]) is None
    assert load_security(GatewaySettings()).tenants is None


@pytest.mark.parametrize(("authorization", "api_key", "key"), [
    ("Bearer abc", None, "abc"),
    ("bearer   abc ", None, "abc"),
    ("BEARER abc", "other", "abc"),  # Authorization first
    ("Basic dXNlcjpwYXNz", "abc", "abc"),  # not a bearer token: the x-api-key header decides
    ("Bearer ", None, None),
    (None, " abc ", "abc"),
    (None, None, None),
])
def test_the_key_is_a_bearer_token_or_x_api_key(authorization, api_key, key):
    assert bearer_key(authorization, api_key) == key


def test_grpc_metadata_carries_the_key_the_same_way():
    assert grpc_key((("x-headrace-slo-ms", "50"), ("authorization", "Bearer abc"))) == "abc"
    assert grpc_key((("x-api-key", b"abc"),)) == "abc"
    assert grpc_key(None) is None


def test_over_quota_is_a_quota_rejection_with_the_wait_until_the_next_token():
    clock = Clock()
    t = tenants_of({"name": "a", "keys": [{"sha256": sha(KEY_A)}], "quota": {"rate": 4, "burst": 2}},
                   {"name": "b", "keys": [{"sha256": sha(KEY_B)}]}, clock=clock)
    a, b = t.identify(KEY_A), t.identify(KEY_B)
    t.admit(a)
    t.admit(a)
    with pytest.raises(Rejected) as e:
        t.admit(a)
    assert e.value.reason == QUOTA and e.value.retry_after == pytest.approx(0.25)
    assert e.value.http_status == 429 and "tenant 'a'" in str(e.value) and KEY_A not in str(e.value)
    for _ in range(100):  # NOTE: a tenant without a quota is never refused by one
        t.admit(b)
    clock.now += 0.25
    t.admit(a)


def test_a_quota_without_a_burst_allows_one_second_of_its_rate():
    clock = Clock()
    t = tenants_of({"name": "a", "keys": [{"sha256": sha(KEY_A)}], "quota": {"rate": 3.5}}, clock=clock)
    a = t.identify(KEY_A)
    for _ in range(4):
        t.admit(a)
    with pytest.raises(Rejected):
        t.admit(a)


# --------------------------------------------------------------------------- bad settings


@pytest.mark.parametrize(("spec", "environ", "says"), [
    ({"env": "NOPE"}, {}, "tenants.0.keys.0.env: environment variable NOPE is not set"),
    ({"env": "EMPTY"}, {"EMPTY": "  "}, "tenants.0.keys.0.env: environment variable EMPTY is empty"),
    ({"file": "missing.key"}, {}, "tenants.0.keys.0.file: cannot read {d}/missing.key: No such file or directory"),
    ({"file": "empty.key"}, {}, "tenants.0.keys.0.file: {d}/empty.key is empty"),
])
def test_a_key_that_cannot_be_read_is_one_error_naming_its_field(tmp_path, spec, environ, says):
    (tmp_path / "empty.key").write_text("\n")
    with pytest.raises(ConfigError) as e:
        tenants_of({"name": "a", "keys": [spec]}, environ=environ, base_dir=tmp_path)
    assert str(e.value) == says.format(d=tmp_path)


def test_one_key_for_two_tenants_is_refused_without_showing_it():
    with pytest.raises(ConfigError) as e:
        tenants_of({"name": "a", "keys": [{"env": "K"}]}, {"name": "b", "keys": [{"sha256": sha(KEY_A)}]},
                   environ={"K": KEY_A})
    assert str(e.value) == "tenants.1.keys.0: the same key as tenants.0.keys.0; a key identifies one tenant"


@pytest.mark.parametrize(("doc", "says"), [
    ({"tenants": [{"name": "a", "keys": [{"env": "K", "sha256": "0" * 64}]}]}, "exactly one of env, file, fd or sha256"),
    ({"tenants": [{"name": "a", "keys": [{}]}]}, "exactly one of env, file, fd or sha256"),
    ({"tenants": [{"name": "a", "keys": [{"sha256": "xyz"}]}]}, "tenants.0.keys.0.sha256"),
    ({"tenants": [{"name": "a", "keys": [{"key": "plain"}]}]}, "tenants.0.keys.0.key"),  # no plain-text keys
    ({"tenants": [{"name": "a", "keys": []}]}, "tenants.0.keys"),
    ({"tenants": [{"name": "unauthenticated", "keys": [{"env": "K"}]}]}, "reserved"),
    ({"tenants": [{"name": "a", "keys": [{"env": "K"}]}, {"name": "a", "keys": [{"env": "L"}]}]}, "unique"),
    ({"tenants": [{"name": "a", "keys": [{"env": "K"}], "quota": {"rate": 0}}]}, "tenants.0.quota.rate"),
    ({"tenants": [{"name": "a", "keys": [{"env": "K"}], "priority": "urgent"}]}, "tenants.0.priority"),
    ({"tls": {"cert_file": "c.pem"}}, "tls.key_file"),
    ({"metrics_listen": {"host": "127.0.0.1", "port": 70000}}, "metrics_listen.port"),
])
def test_the_schema_refuses_bad_security_settings(doc, says):
    with pytest.raises(ValidationError) as e:
        GatewaySettings.model_validate(doc)
    assert says in str(e.value).replace("\n", " ").replace("  ", " ") or says in str(e.value)


# --------------------------------------------------------------------------- certificate files


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def test_good_files_make_a_server_context_and_grpc_credentials(pki):
    tls = load_tls(str(pki.server_cert), str(pki.server_key), str(pki.ca))
    assert tls.ssl_context().verify_mode.name == "CERT_REQUIRED"
    assert tls.grpc_credentials() is not None
    assert load_tls(str(pki.server_cert), str(pki.server_key)).ssl_context().verify_mode.name == "CERT_NONE"


@pytest.mark.parametrize("case", ["cert missing", "key missing", "ca missing", "cert not pem", "cert bad pem",
                                  "key not pem", "key of another cert", "key encrypted", "ca not pem"])
def test_a_bad_certificate_file_is_one_error_naming_its_field(pki, tmp_path, case):
    cert, key, ca = str(pki.server_cert), str(pki.server_key), str(pki.ca)
    junk = tmp_path / "junk.pem"
    junk.write_text("hello\n")
    if case == "cert missing":
        cert, says = str(tmp_path / "nope.pem"), f"tls.cert_file: cannot read {tmp_path}/nope.pem: No such file"
    elif case == "key missing":
        key, says = str(tmp_path / "nope.key"), "tls.key_file: cannot read"
    elif case == "ca missing":
        ca, says = str(tmp_path / "nope-ca.pem"), "tls.client_ca_file: cannot read"
    elif case == "cert not pem":
        cert, says = str(junk), "tls.cert_file: " + str(junk) + " is not a PEM certificate"
    elif case == "cert bad pem":
        bad = tmp_path / "bad.pem"
        bad.write_text("-----BEGIN CERTIFICATE-----\nnot base64 at all!\n-----END CERTIFICATE-----\n")
        cert, says = str(bad), "tls.cert_file: " + str(bad) + " is not a valid PEM certificate"
    elif case == "key not pem":
        key, says = str(junk), "tls.key_file: " + str(junk) + " is not a PEM private key"
    elif case == "key of another cert":
        key, says = str(pki.client_key), "tls.key_file: " + str(pki.client_key) + " is not the key of the certificate"
    elif case == "key encrypted":
        enc = tmp_path / "enc.key"
        enc.write_text("-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n")
        key, says = str(enc), "tls.key_file: " + str(enc) + " is encrypted"
    else:
        ca, says = str(junk), "tls.client_ca_file: " + str(junk) + " is not a PEM certificate"
    with pytest.raises(ConfigError) as e:
        load_tls(cert, key, ca)
    assert str(e.value).startswith(says), str(e.value)
    assert "\n" not in str(e.value)


def test_relative_paths_are_read_from_the_config_folder(pki):
    s = GatewaySettings.model_validate({"tls": {"cert_file": pki.server_cert.name, "key_file": pki.server_key.name,
                                                "client_ca_file": pki.ca.name},
                                        "tenants": [{"name": "a", "keys": [{"sha256": sha(KEY_A)}]}]})
    sec = load_security(s, base_dir=pki.ca.parent)
    assert sec.tls is not None and sec.tls.client_ca == pki.read("ca")
    with pytest.raises(ConfigError, match=r"^spec\.tls\.cert_file: cannot read"):
        load_security(s, prefix="spec.", base_dir=Path("/nonexistent"))


def test_api_key_spec_keeps_digests_lower_case():
    assert ApiKeySpec(sha256="AB" * 32).sha256 == "ab" * 32
