"""The Python client over TLS, mutual TLS and a bearer token, against the
real rvd, with certificates made by the test (tests/integration/pki.py);
the same rules as rvctl's (client/cpp/channel.h)."""
import grpc
import numpy as np
import pytest

import rvd
from daemons import start_daemon
from pki import make_pki

TOKEN = "py-client-token-0123456789"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = make_pki(tmp_path_factory.mktemp("pki"))
    (d / "token").write_text(TOKEN + "\n")
    return d


@pytest.fixture(scope="module")
def secured(tmp_path_factory, pki):
    """rvd with mutual TLS and a token."""
    creds = grpc.composite_channel_credentials(
        grpc.ssl_channel_credentials((pki / "ca.pem").read_bytes(),
                                     (pki / "client.key").read_bytes(),
                                     (pki / "client.pem").read_bytes()),
        grpc.access_token_call_credentials(TOKEN))
    d = start_daemon(tmp_path_factory.mktemp("rvd-tls"), credentials=creds,
                     tls_cert_file=str(pki / "server.pem"),
                     tls_key_file=str(pki / "server.key"),
                     tls_client_ca_file=str(pki / "ca.pem"),
                     auth_token_file=str(pki / "token"))
    yield d
    d.stop()


def measure_one(client, seed):
    w = np.random.default_rng(seed).standard_normal((16, 64)).astype(np.float32)
    m = client.measure("tls-model", [rvd.Tensor(0, w)])
    s = np.linalg.svd(w.astype(np.float64), compute_uv=False) ** 2
    assert abs(m.per_layer_pr[0] / (s.sum() ** 2 / (s ** 2).sum()) - 1) < 1e-5


def test_mutual_tls_and_token_from_a_file(secured, pki, seed):
    c = rvd.Client(secured.grpc_address, tls_ca_file=str(pki / "ca.pem"),
                   tls_cert_file=str(pki / "client.pem"),
                   tls_key_file=str(pki / "client.key"),
                   auth_token_file=str(pki / "token"))
    measure_one(c, seed)
    assert "tls-model" in [s.model_id for s in c.models()]
    c.close()


def test_token_from_the_environment(secured, pki, monkeypatch):
    monkeypatch.setenv("RVD_AUTH_TOKEN", TOKEN)
    c = rvd.Client(secured.grpc_address, tls_ca_file=str(pki / "ca.pem"),
                   tls_cert_file=str(pki / "client.pem"),
                   tls_key_file=str(pki / "client.key"))
    c.models()
    c.close()


def test_wrong_or_missing_token_is_unauthenticated(secured, pki, monkeypatch):
    monkeypatch.delenv("RVD_AUTH_TOKEN", raising=False)
    tls = dict(tls_ca_file=str(pki / "ca.pem"),
               tls_cert_file=str(pki / "client.pem"),
               tls_key_file=str(pki / "client.key"))
    for token in ("wrong-token", None):
        c = rvd.Client(secured.grpc_address, auth_token=token, **tls)
        with pytest.raises(rvd.RvdError) as e:
            c.models()
        assert e.value.code == grpc.StatusCode.UNAUTHENTICATED, token
        c.close()


def test_a_client_without_a_certificate_does_not_get_in(secured, pki):
    c = rvd.Client(secured.grpc_address, tls_ca_file=str(pki / "ca.pem"),
                   auth_token=TOKEN, timeout=5)
    with pytest.raises(rvd.RvdError) as e:
        c.models()
    assert e.value.code == grpc.StatusCode.UNAVAILABLE
    c.close()


def test_bad_settings_are_refused_before_any_call(pki, monkeypatch):
    monkeypatch.delenv("RVD_AUTH_TOKEN", raising=False)
    with pytest.raises(ValueError, match="needs TLS"):
        rvd.Client("127.0.0.1:1", auth_token=TOKEN)
    with pytest.raises(ValueError, match="both or neither"):
        rvd.Client("127.0.0.1:1", tls_ca_file=str(pki / "ca.pem"),
                   tls_cert_file=str(pki / "client.pem"))
    with pytest.raises(ValueError, match="tls_ca_file"):
        rvd.Client("127.0.0.1:1", tls_ca_file=str(pki / "missing.pem"))
    (pki / "two-tokens").write_text("a b\n")
    with pytest.raises(ValueError, match="one token"):
        rvd.Client("127.0.0.1:1", tls=True, auth_token_file=str(pki / "two-tokens"))
