"""TLS from the gateway to Triton: over gRPC to Triton's own TLS endpoint (mutual TLS, a
client certificate required), and over HTTPS to a TLS front (here another headrace gateway,
which speaks Triton's protocol); a certificate the gateway cannot verify keeps the replica
out of service, and a bad TLS file is one line naming the field."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient

from gateway.app import GatewayThread
from gateway.config import parse_config, resolve
from gateway.errors import ConfigError
from profiles.triton.server import TritonServer
from tests.gateway.test_front_door_contract import PROFILE, triton_repo
from tests.pki import make_pki

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def config(url: str, protocol: str, replica_tls: dict | None, **settings) -> dict:
    replica = {"url": url, "protocol": protocol, "variant": "affine-v1", "profile": PROFILE}
    if replica_tls is not None:
        replica["tls"] = replica_tls
    return {"listen": {"http_port": 0, "grpc_port": 0}, "startup_timeout_s": 20, **settings,
            "models": [{"name": "affine", "slo_ms": 2000, "max_batch": 8, "replicas": [replica]}]}


def infer(gw) -> np.ndarray:  # noqa: ANN001
    c = httpclient.InferenceServerClient(gw.http_url)
    x = httpclient.InferInput("x", [1, 3], "FP32")
    x.set_data_from_numpy(np.ones((1, 3), np.float32))
    try:
        return c.infer("affine", [x]).as_numpy("y")
    finally:
        c.close()


@pytest.fixture(scope="module")
def tls_triton(tmp_path_factory, pki):
    """Triton whose gRPC endpoint speaks mutual TLS only."""
    args = ["--grpc-use-ssl-mutual=true", f"--grpc-server-cert={pki.server_cert}",
            f"--grpc-server-key={pki.server_key}", f"--grpc-root-cert={pki.ca}"]
    with TritonServer(triton_repo(tmp_path_factory.mktemp("repo")), extra_args=args) as t:
        yield t


def test_grpc_to_tritons_mutual_tls_endpoint(tls_triton, pki):
    tls = {"ca_file": str(pki.ca), "cert_file": str(pki.client_cert), "key_file": str(pki.client_key)}
    with GatewayThread(parse_config(config(tls_triton.grpc_url, "grpc", tls))) as gw:
        assert infer(gw).tolist() == [[2.0, 2.0, 2.0]]


def test_a_replica_whose_certificate_is_not_trusted_stays_out_of_service(tls_triton, pki):
    tls = {"ca_file": str(pki.client_cert), "cert_file": str(pki.client_cert), "key_file": str(pki.client_key)}
    cfg = parse_config(config(tls_triton.grpc_url, "grpc", tls, startup_timeout_s=2))
    with pytest.raises(Exception, match="no replica answered metadata"), GatewayThread(cfg):  # noqa: B017
        pass


def test_https_to_a_tls_front(tmp_path_factory, pki):
    with TritonServer(triton_repo(tmp_path_factory.mktemp("repo"))) as triton:
        front_doc = config(triton.http_url, "http", None,
                           tls={"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)})
        with GatewayThread(parse_config(front_doc)) as front:
            # the front serves 'affine'; the gateway under test reaches it as its replica over HTTPS
            doc = config(front.http_url, "http", {"ca_file": str(pki.ca)})
            doc["models"][0]["replicas"][0]["variant"] = "affine"
            with GatewayThread(parse_config(doc)) as gw:
                assert infer(gw).tolist() == [[2.0, 2.0, 2.0]]


def test_bad_tls_files_are_one_line_naming_the_field(tmp_path, pki):
    missing = config("127.0.0.1:1", "grpc", {"ca_file": str(tmp_path / "nope.pem")})
    with pytest.raises(ConfigError, match=r"models\.0\.replicas\.0\.tls\.ca_file: cannot read"):
        resolve(parse_config(missing))
    with pytest.raises(ConfigError, match="cert_file and key_file go together"):
        parse_config(config("127.0.0.1:1", "grpc", {"cert_file": str(pki.client_cert)}))
