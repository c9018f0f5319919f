"""``headrace load`` against a gateway with TLS and API-key tenants (in process, fake replicas
that echo): HTTPS with both HTTP clients and a secure gRPC channel, the key as a bearer token
(one for all, or one per model), mutual TLS, and one-line failures when the key, the CA or
the client certificate is missing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import pytest

from gateway.app import Gateway, GatewayThread
from gateway.config import parse_config
from loadgen.clients import LoadError
from loadgen.run import LoadResult, run_load
from loadgen.spec import InputSpec, LoadSpec
from tests.gateway.test_front_door_security import PLAIN, Echo, config, tls
from tests.pki import Pki, make_pki

X = (InputSpec(name="x", shape=(1, 2)),)


@contextlib.contextmanager
def gateway(**settings) -> Iterator[Gateway]:
    with GatewayThread(parse_config(config(**settings)), replica_factory=lambda _, url: Echo(url)) as gw:
        yield gw


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def keyed_tls(pki, tmp_path_factory) -> Iterator[Gateway]:
    """TLS on both listeners and one tenant whose key is PLAIN."""
    key = tmp_path_factory.mktemp("keys") / "plain.key"
    key.write_text(PLAIN + "\n")
    with gateway(tls=tls(pki), tenants=[{"name": "plain", "keys": [{"file": str(key)}]}]) as gw:
        yield gw


def load(url: str, **spec) -> LoadResult:
    fields = {"model": "m", "rate": 100, "duration_s": 0.4, "warmup_s": 0.1, "inputs": X,
              "lag_warn_ms": 1000, **spec}  # fmt: skip
    return asyncio.run(run_load(LoadSpec(target=url, **fields)))


@pytest.mark.parametrize(("scheme", "client"), [("http", "raw"), ("http", "aiohttp"), ("grpc", "raw")])
def test_tls_and_a_bearer_key_reach_the_model(keyed_tls, pki, scheme, client) -> None:
    url = f"https://{keyed_tls.http_url}" if scheme == "http" else f"grpc://{keyed_tls.grpc_url}"
    s = load(url, tls=True, ca_file=pki.ca, api_key=PLAIN, http_client=client).summary
    assert s["offered"] > 20 and s["ok"] == s["offered"], s["errors"]
    assert s["run"]["spec"]["api_key"] == "<set>"  # the record never holds the key


@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_a_key_per_model_overrides_the_common_one(keyed_tls, pki, scheme) -> None:
    url = f"https://{keyed_tls.http_url}" if scheme == "http" else f"grpc://{keyed_tls.grpc_url}"
    s = load(url, tls=True, ca_file=pki.ca, api_key="wrong", model_keys=(("m", PLAIN),)).summary
    assert s["ok"] == s["offered"] > 20


def test_requests_without_the_key_are_counted_as_401(keyed_tls, pki) -> None:
    # NOTE: fixed inputs skip the metadata probe (health probes need no key): every
    # inference is then refused, and counted by kind
    s = load(f"https://{keyed_tls.http_url}", ca_file=pki.ca).summary
    assert s["ok"] == 0 and s["errors"] == {"http_401": s["offered"]}


def test_missing_key_ca_or_tls_fail_before_the_run_in_one_line(keyed_tls, pki) -> None:
    url = f"https://{keyed_tls.http_url}"
    with pytest.raises(LoadError, match="401.*the target wants an API key: --api-key"):
        load(url, ca_file=pki.ca, inputs=None)
    with pytest.raises(LoadError, match="401.*the key was refused"):
        load(url, ca_file=pki.ca, inputs=None, api_key="wrong")
    with pytest.raises(LoadError, match="TLS with https://.* failed: .*certificate"):
        load(url, api_key=PLAIN)  # the system trust store does not know the test CA
    with pytest.raises(LoadError, match="400: this port speaks TLS: use https://"):
        load(f"http://{keyed_tls.http_url}", api_key=PLAIN)


def test_mutual_tls_presents_the_client_certificate(pki) -> None:
    with gateway(tls=tls(pki, mutual=True)) as gw:
        for url in (f"https://{gw.http_url}", f"grpc://{gw.grpc_url}"):
            s = load(url, tls=True, ca_file=pki.ca, client_cert=pki.client_cert,
                     client_key=pki.client_key).summary  # fmt: skip
            assert s["ok"] == s["offered"] > 20, (url, s["errors"])
        with pytest.raises(LoadError):  # no certificate: the handshake is refused
            load(f"https://{gw.http_url}", ca_file=pki.ca)


def test_keys_come_from_the_environment_and_never_from_the_record(monkeypatch) -> None:
    from loadgen.record import run_record
    from tests.loadgen.test_loadgen_record import parse

    monkeypatch.setenv("KEY_ALL", "k-all")
    monkeypatch.setenv("KEY_B", "k-b")
    from loadgen.cli import spec_from_args

    spec = spec_from_args(parse("--target", "https://h:1", "--mix", "a,b", "--api-key-env",
                                "KEY_ALL", "--model-key", "b=KEY_B"))  # fmt: skip
    assert spec.secure and spec.key_for("a") == "k-all" and spec.key_for("b") == "k-b"
    rec = run_record(spec)["spec"]
    assert rec["api_key"] == "<set>" and rec["model_keys"] == [["b", "<set>"]]
    assert "k-all" not in str(run_record(spec)) and "k-b" not in str(run_record(spec))
    with pytest.raises(ValueError, match="--api-key-env NOPE: the variable is not set"):
        spec_from_args(parse("--target", "http://h:1", "--model", "a", "--api-key-env", "NOPE"))
    with pytest.raises(ValueError, match="model_keys name \\['c'\\]"):
        spec_from_args(parse("--target", "http://h:1", "--model", "a", "--model-key", "c=KEY_B"))
