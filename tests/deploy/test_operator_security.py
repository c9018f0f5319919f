"""The Gateway document's security settings, from ``headrace up`` to a client: TLS and
tenants reach the gateway the operator starts (relative paths read from the YAML file's
folder), the admin API speaks HTTPS and still asks for its token, ``headrace status`` verifies
it with ``--admin-ca`` or the certificate ``up`` recorded, and a setting that cannot work is
refused in one line before anything starts."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml
from tritonclient.utils import InferenceServerException

from deploy.cli import main
from deploy.operator.admin import serve_admin
from deploy.operator.client import CliError, admin_context, call
from deploy.operator.state import DirStateStore
from gateway.frontdoor.tls import load_tls
from tests.operator_harness import deployment, operator_up, pool, write_docs
from tests.pki import Pki, make_pki

TEAM_A = "team-a-93e1d0c7b6f24a58"
TEAM_B = "team-b-1c5d7e9f0a2b4c68"
TEAM_A_ENV = "HEADRACE_TEST_TEAM_A_KEY"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def secured_gateway(folder: Path, pki: Pki, **spec: Any) -> dict[str, Any]:
    """A Gateway document whose certificates and key files sit beside it, named relatively."""
    (folder / "certs").mkdir(parents=True, exist_ok=True)
    for f in (pki.server_cert, pki.server_key, pki.ca):
        shutil.copy(f, folder / "certs" / f.name)
    (folder / "team-b.key").write_text(TEAM_B + "\n")
    return {"apiVersion": "headrace.dev/v1", "kind": "Gateway", "metadata": {"name": "gw"}, "spec": {
        "listen": {"host": "127.0.0.1", "http_port": 0, "grpc_port": 0},
        "tls": {"cert_file": "certs/server.pem", "key_file": "certs/server.key"},
        "tenants": [{"name": "team-a", "keys": [{"env": TEAM_A_ENV}]},
                    {"name": "team-b", "keys": [{"file": "team-b.key"}], "priority": "best-effort"}],
        "admin": {"tls": {"cert_file": "certs/server.pem", "key_file": "certs/server.key"}},
        **spec}}


def status(state: Path, capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["status", "--state-dir", str(state), "-o", "json", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.integration
def test_up_serves_tls_and_tenants_from_the_gateway_document(tmp_path, pki, monkeypatch, capsys):
    monkeypatch.setenv(TEAM_A_ENV, TEAM_A)  # NOTE: the detached controller inherits the environment
    monkeypatch.delenv("HEADRACE_ADMIN_CA", raising=False)
    docs = write_docs(tmp_path / "d.yaml", pool(a100s=1, host=False), deployment("resnet50", 50, 100),
                      secured_gateway(tmp_path, pki))
    with operator_up(tmp_path, docs) as op:
        http_url, grpc_url = op.state()["gateway"]["http"], op.state()["gateway"]["grpc"]
        x = np.arange(16, dtype=np.float32).reshape(1, 16)
        c = httpclient.InferenceServerClient(http_url, ssl=True, ssl_options={"ca_certs": str(pki.ca)})
        hx = httpclient.InferInput("INPUT0", [1, 16], "FP32")
        hx.set_data_from_numpy(x)
        with pytest.raises(InferenceServerException, match="401"):
            c.infer("resnet50", [hx])
        res = c.infer("resnet50", [hx], headers={"Authorization": f"Bearer {TEAM_A}"})
        np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), x + 1)
        assert c.is_server_ready()  # the probe needs no key
        c.close()
        g = grpcclient.InferenceServerClient(grpc_url, ssl=True, root_certificates=str(pki.ca))
        gx = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        gx.set_data_from_numpy(x)
        out = g.infer("resnet50", [gx], headers={"x-api-key": TEAM_B}).as_numpy("OUTPUT0")
        np.testing.assert_array_equal(out, x + 1)
        with pytest.raises(InferenceServerException, match="UNAUTHENTICATED"):
            g.infer("resnet50", [gx], headers={"x-api-key": TEAM_B + "x"})
        g.close()

        # the admin API: HTTPS, verified by --admin-ca, by the certificate up recorded, never by nothing
        assert op.url.startswith("https://127.0.0.1:")
        code, out, _ = status(op.state_dir, capsys, "--admin-ca", str(pki.ca))
        assert code == 0 and json.loads(out)["generation"] == 1
        assert status(op.state_dir, capsys)[0] == 0
        code, _, err = status(op.state_dir, capsys, "--admin-ca", str(pki.stranger_cert))
        assert code == 2 and "cannot verify the controller" in err and "--admin-ca" in err
        with pytest.raises(CliError, match="^401"):
            call(op.url, "wrong", "GET", "/v1/status", context=admin_context(str(pki.ca)))
        log = (op.state_dir / "controller.log").read_text()
        assert TEAM_A not in log and TEAM_B not in log
        assert main(["down", "--state-dir", str(op.state_dir)]) == 0


@pytest.mark.parametrize(("case", "says"), [
    ("cert missing", "document 2: spec.tls.cert_file: cannot read {d}/certs/nope.pem"),
    ("key env unset", f"document 2: spec.tenants.0.keys.0.env: environment variable {TEAM_A_ENV} is not set"),
    ("admin key of another cert", "document 2: spec.admin.tls.key_file: "),
])
def test_up_refuses_a_gateway_whose_security_cannot_work_in_one_line(tmp_path, pki, monkeypatch, capsys, case, says):
    monkeypatch.setenv(TEAM_A_ENV, TEAM_A)
    gw = secured_gateway(tmp_path, pki)
    if case == "cert missing":
        gw["spec"]["tls"]["cert_file"] = "certs/nope.pem"
    elif case == "key env unset":
        monkeypatch.delenv(TEAM_A_ENV)
    else:
        gw["spec"]["admin"]["tls"]["key_file"] = str(pki.client_key)
    docs = write_docs(tmp_path / "d.yaml", pool(a100s=1, host=False), deployment("resnet50", 50, 100), gw)
    state = tmp_path / "state"
    code = main(["up", "-f", str(docs), "--state-dir", str(state)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"headrace up: {docs} ") and says.format(d=tmp_path) in err, err
    assert not DirStateStore(state).read().get("processes")  # NOTE: nothing was started


# --------------------------------------------------------------------------- the admin API alone


class _Controller:
    def status(self) -> dict[str, Any]:
        return {"generation": 7}


@pytest.fixture
def https_admin(pki) -> Iterator[str]:
    """The admin API over HTTPS on its own loop, with a stand-in controller; token ``t0k3n``."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    ctx = load_tls(str(pki.server_cert), str(pki.server_key)).ssl_context()
    runner, url = asyncio.run_coroutine_threadsafe(
        serve_admin(_Controller(), "t0k3n", "127.0.0.1", 0, ctx), loop).result(10)  # type: ignore[arg-type]
    try:
        yield url
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_the_admin_api_over_https_keeps_its_token_and_is_verified_by_the_client(https_admin, pki, tmp_path):
    assert https_admin.startswith("https://127.0.0.1:")
    assert call(https_admin, "t0k3n", "GET", "/v1/status", context=admin_context(str(pki.ca))) == {"generation": 7}
    # the certificate up recorded is enough on the controller's host
    assert call(https_admin, "t0k3n", "GET", "/v1/status",
                context=admin_context(None, str(pki.server_cert))) == {"generation": 7}
    with pytest.raises(CliError, match="^401") as e:
        call(https_admin, "wrong", "GET", "/v1/status", context=admin_context(str(pki.ca)))
    for ctx in (None, admin_context(str(pki.stranger_cert))):  # the system's CAs, or the wrong CA
        with pytest.raises(CliError, match="cannot verify the controller") as e:
            call(https_admin, "t0k3n", "GET", "/v1/status", context=ctx)
        assert e.value.code == 2
    with pytest.raises(CliError, match="--admin-ca .*nope.pem: cannot load it") as e:
        admin_context(str(tmp_path / "nope.pem"))
    assert e.value.code == 2


def test_relative_paths_in_the_gateway_document_become_absolute_for_the_controller(tmp_path, pki):
    from deploy.operator.documents import resolved_stream

    docs = write_docs(tmp_path / "d.yaml", pool(a100s=1, host=False), deployment("resnet50", 50, 100),
                      secured_gateway(tmp_path, pki))
    gw = [d for d in yaml.safe_load_all(resolved_stream([docs])) if d["kind"] == "Gateway"][0]["spec"]
    assert gw["tls"] == {"cert_file": str(tmp_path / "certs/server.pem"), "key_file": str(tmp_path / "certs/server.key")}
    assert gw["admin"]["tls"]["cert_file"] == str(tmp_path / "certs/server.pem")
    assert gw["tenants"][1]["keys"] == [{"file": str(tmp_path / "team-b.key")}]
    assert gw["tenants"][0]["keys"] == [{"env": TEAM_A_ENV}]
