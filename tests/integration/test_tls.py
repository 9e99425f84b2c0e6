"""TLS, mutual TLS and the bearer token (server/security.h), against the real
rvd and rvctl, with certificates the test generates (openssl CLI): a CA, a
server certificate for 127.0.0.1 and localhost, a client certificate from
the same CA, and a client certificate from another CA (pki.py)."""
import json
import os
import subprocess
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest

from pki import make_pki
from rvdtest import (RVD, Daemon, free_port, health_pb2, health_pb2_grpc,
                     rvd_pb2, rvd_pb2_grpc, write_llama)

TOKEN = "s3cret-token-0123456789abcdef"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = make_pki(tmp_path_factory.mktemp("pki"))
    (d / "token").write_text(TOKEN + "\n")
    (d / "wrong-token").write_text("not-the-token\n")
    return d


def read(p):
    return p.read_bytes()


def tls_config(pki, **extra):
    cfg = {"tls_cert_file": str(pki / "server.pem"),
           "tls_key_file": str(pki / "server.key")}
    cfg.update(extra)
    return cfg


def server_creds(pki, client=None):
    if client is None:
        return grpc.ssl_channel_credentials(read(pki / "ca.pem"))
    return grpc.ssl_channel_credentials(read(pki / "ca.pem"),
                                        read(pki / f"{client}.key"),
                                        read(pki / f"{client}.pem"))


def list_models(channel, metadata=None):
    return rvd_pb2_grpc.RvdStub(channel).ListModels(
        rvd_pb2.ListModelsRequest(), metadata=metadata, timeout=5)


def code_of(call):
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value.code(), e.value.details()


def health(channel):
    return health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service="rvd.v1.Rvd"), timeout=5).status


def test_tls_serves_tls_clients_only(tmp_path, pki):
    d = Daemon(tmp_path, credentials=server_creds(pki), **tls_config(pki))
    try:
        assert list(list_models(d.channel).models) == []
        assert "TLS" in d.log_text()
        # A plaintext client does not get through the handshake.
        plain = grpc.insecure_channel(d.grpc_address)
        code, _ = code_of(lambda: list_models(plain))
        assert code == grpc.StatusCode.UNAVAILABLE
        plain.close()
        # A client that trusts another CA refuses rvd's certificate.
        other = grpc.secure_channel(
            d.grpc_address, grpc.ssl_channel_credentials(read(pki / "other-ca.pem")))
        code, _ = code_of(lambda: list_models(other))
        assert code == grpc.StatusCode.UNAVAILABLE
        other.close()
        # rvctl over TLS: measures (a stream) and reads back.
        write_llama(tmp_path / "m", np.random.default_rng(7), layers=4)
        ca = ["--tls-ca-file", pki / "ca.pem"]
        d.rvctl(*ca, "measure", tmp_path / "m", "--model-id", "tls-m")
        out = json.loads(d.rvctl(*ca, "models", "--json").stdout)
        assert [m["model_id"] for m in out] == ["tls-m"]
        r = d.rvctl("models", check=False)  # plaintext rvctl
        assert r.returncode == 1 and "UNAVAILABLE" in r.stderr
        # /metrics stays plain HTTP on loopback, read-only.
        url = f"http://{d.metrics_address}/metrics"
        assert b"rvd_" in urllib.request.urlopen(url, timeout=5).read()
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(url, data=b"x",
                                                          method="POST"), timeout=5)
        assert e.value.code == 405
    finally:
        d.stop()


def test_mutual_tls_refuses_clients_without_a_signed_certificate(tmp_path, pki):
    d = Daemon(tmp_path, credentials=server_creds(pki, client="client"),
               **tls_config(pki, tls_client_ca_file=str(pki / "ca.pem")))
    try:
        assert "mutual TLS" in d.log_text()
        assert list(list_models(d.channel).models) == []
        for creds in (server_creds(pki), server_creds(pki, client="stranger")):
            ch = grpc.secure_channel(d.grpc_address, creds)
            code, _ = code_of(lambda: list_models(ch))
            assert code == grpc.StatusCode.UNAVAILABLE
            ch.close()
        ca = ["--tls-ca-file", pki / "ca.pem"]
        assert d.rvctl(*ca, "models", check=False).returncode == 1
        d.rvctl(*ca, "--tls-cert-file", pki / "client.pem",
                "--tls-key-file", pki / "client.key", "models")
        r = d.rvctl(*ca, "--tls-cert-file", pki / "client.pem", "models",
                    check=False)
        assert r.returncode == 1 and "go together" in r.stderr
    finally:
        d.stop()


def test_bearer_token_required_on_every_call_but_health(tmp_path, pki):
    d = Daemon(tmp_path, credentials=server_creds(pki), log_level="debug",
               **tls_config(pki, auth_token_file=str(pki / "token")))
    try:
        # Daemon() waited on the health check without a token: probes work.
        assert health(d.channel) == health_pb2.HealthCheckResponse.SERVING
        code, details = code_of(lambda: list_models(d.channel))
        assert code == grpc.StatusCode.UNAUTHENTICATED, details
        code, _ = code_of(lambda: list_models(
            d.channel, metadata=(("authorization", "Bearer not-it"),)))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        # The token itself without "Bearer ", and a prefix of it: refused.
        for value in (TOKEN, "Bearer " + TOKEN[:-1], "Bearer " + TOKEN + "x"):
            code, _ = code_of(lambda: list_models(
                d.channel, metadata=(("authorization", value),)))
            assert code == grpc.StatusCode.UNAUTHENTICATED, value
        assert list(list_models(
            d.channel, metadata=(("authorization", "Bearer " + TOKEN),)).models) == []
        # Every method, a stream too: GetLatest and WatchMeasurements.
        stub = rvd_pb2_grpc.RvdStub(d.channel)
        code, _ = code_of(lambda: stub.GetLatest(
            rvd_pb2.GetLatestRequest(model_id="x"), timeout=5))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        code, _ = code_of(lambda: next(stub.WatchMeasurements(
            rvd_pb2.WatchRequest(), timeout=5)))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        # Python's standard way: call credentials composed with TLS.
        composite = grpc.secure_channel(d.grpc_address, grpc.composite_channel_credentials(
            server_creds(pki), grpc.access_token_call_credentials(TOKEN)))
        assert list(list_models(composite).models) == []
        composite.close()

        # rvctl: --auth-token-file, RVD_AUTH_TOKEN, a wrong one, none.
        ca = ["--tls-ca-file", pki / "ca.pem"]
        write_llama(tmp_path / "m", np.random.default_rng(8), layers=4)
        d.rvctl(*ca, "--auth-token-file", pki / "token", "measure",
                tmp_path / "m", "--model-id", "tok-m")
        r = d.rvctl(*ca, "models", "--json", env=dict(os.environ, RVD_AUTH_TOKEN=TOKEN))
        assert [m["model_id"] for m in json.loads(r.stdout)] == ["tok-m"]
        r = d.rvctl(*ca, "--auth-token-file", pki / "wrong-token", "models",
                    check=False)
        assert r.returncode == 1 and "UNAUTHENTICATED" in r.stderr
        no_token = {k: v for k, v in os.environ.items() if k != "RVD_AUTH_TOKEN"}
        r = d.rvctl(*ca, "latest", "tok-m", check=False, env=no_token)
        assert r.returncode == 1 and "UNAUTHENTICATED" in r.stderr
        assert TOKEN not in r.stderr
        # The token never reaches the log, even at debug level.
        assert TOKEN not in d.log_text()
    finally:
        d.stop()


def run_rvd(tmp_path, **cfg):
    """Starts rvd with `cfg` and expects it to exit at once; returns
    (exit status, stderr)."""
    base = {"grpc_address": f"127.0.0.1:{free_port()}", "metrics_address": "",
            "backend": "cpu", "engine_threads": 1}
    base.update(cfg)
    path = tmp_path / f"bad-{free_port()}.yaml"
    path.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in base.items()))
    r = subprocess.run([str(RVD), "--config", str(path)], capture_output=True,
                       text=True, timeout=30)
    return r.returncode, r.stderr


def test_bad_security_settings_are_clear_errors_at_start(tmp_path, pki):
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("this is not a certificate\n")
    empty = tmp_path / "empty-token"
    empty.write_text("\n")
    spaced = tmp_path / "spaced-token"
    spaced.write_text("two words\n")
    cases = [
        # (config, exit status, words the error must contain)
        (tls_config(pki, tls_cert_file=str(tmp_path / "missing.pem")), 1,
         ["tls_cert_file", "missing.pem", "cannot open"]),
        (tls_config(pki, tls_cert_file=str(garbage)), 1,
         ["tls_cert_file", "no PEM certificate"]),
        (tls_config(pki, tls_key_file=str(garbage)), 1,
         ["tls_key_file", "no unencrypted PEM private key"]),
        (tls_config(pki, tls_key_file=str(pki / "client.key")), 1,
         ["tls_key_file", "does not belong"]),
        (tls_config(pki, tls_client_ca_file=str(garbage)), 1,
         ["tls_client_ca_file", "no PEM certificate"]),
        (tls_config(pki, auth_token_file=str(empty)), 1,
         ["auth_token_file", "is empty"]),
        (tls_config(pki, auth_token_file=str(spaced)), 1,
         ["auth_token_file", "visible ASCII"]),
        ({"tls_cert_file": str(pki / "server.pem")}, 2,
         ["give both"]),
        ({"auth_token_file": str(pki / "token")}, 2,
         ["auth_token_file", "needs TLS"]),
        ({"tls_client_ca_file": str(pki / "ca.pem")}, 2,
         ["tls_client_ca_file", "needs"]),
    ]
    for cfg, status, words in cases:
        code, err = run_rvd(tmp_path, **cfg)
        assert code == status, (cfg, code, err)
        for w in words:
            assert w in err, (cfg, w, err)
        assert TOKEN not in err


def test_plaintext_on_a_non_loopback_address_warns(tmp_path, pki):
    d = Daemon(tmp_path)
    try:
        assert "plaintext and reachable" not in d.log_text()
    finally:
        d.stop()
    port = free_port()
    d = Daemon(tmp_path, grpc_address=f"0.0.0.0:{port}")
    try:
        assert "plaintext and reachable from other hosts" in d.log_text()
    finally:
        d.stop()
    d = Daemon(tmp_path, credentials=server_creds(pki),
               **tls_config(pki, grpc_address=f"0.0.0.0:{free_port()}"))
    try:
        assert "plaintext" not in d.log_text()
        assert "TLS that authenticates no client" in d.log_text()
    finally:
        d.stop()
    d = Daemon(tmp_path, credentials=server_creds(pki),
               **tls_config(pki, grpc_address=f"0.0.0.0:{free_port()}",
                            auth_token_file=str(pki / "token")))
    try:
        assert "reachable from other hosts" not in d.log_text()
    finally:
        d.stop()
