"""The C++ client as an installed package: `cmake --install` into a temporary
prefix, then client/examples/ (copied out of the tree, so that it can only
see what was installed) configured with find_package(rvd), built, and run
against a real rvd."""
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "integration"))
import grpc  # noqa: E402
from pki import make_pki  # noqa: E402
from rvdtest import BUILD, Daemon, write_llama  # noqa: E402

SOURCE = pathlib.Path(__file__).resolve().parents[2]


def run(*args, **kw):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True,
                       timeout=600, **kw)
    assert r.returncode == 0, f"{args} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r


def test_example_builds_against_the_installed_package_and_talks_to_rvd(tmp_path):
    prefix = tmp_path / "prefix"
    run("cmake", "--install", BUILD, "--prefix", prefix)
    for f in ("lib/cmake/rvd/rvdConfig.cmake", "lib/cmake/rvd/rvdTargets.cmake",
              "lib/librvd_client.a", "lib/librvd_proto.a",
              "include/client/cpp/rvd_client.h", "include/client/cpp/channel.h",
              "include/rvd/v1/rvd.grpc.pb.h", "include/kernels/engine.h",
              "bin/rvd", "bin/rvctl"):
        assert (prefix / f).exists(), f
    # Nothing in the installed targets points back into the tree.
    targets = (prefix / "lib/cmake/rvd/rvdTargets.cmake").read_text()
    assert str(SOURCE) not in targets and str(BUILD) not in targets

    example = tmp_path / "example"
    shutil.copytree(SOURCE / "client" / "examples", example)
    configure = ["cmake", "-S", example, "-B", tmp_path / "ex",
                 f"-DCMAKE_PREFIX_PATH={prefix}", "-DCMAKE_BUILD_TYPE=Release"]
    if shutil.which("ccache"):
        configure.append("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")
    run(*configure)
    run("cmake", "--build", tmp_path / "ex", "-j2")
    exe = tmp_path / "ex" / "rvd_models"

    r = run(exe, "--help")
    assert r.stdout.startswith("usage: rvd_models")
    r = subprocess.run([str(exe), "--bogus", "x"], capture_output=True, text=True)
    assert r.returncode == 2 and "unknown flag --bogus" in r.stderr
    # A token without TLS is refused by the library before any call.
    (tmp_path / "token").write_text("t0ken\n")
    r = subprocess.run([str(exe), "--auth-token-file", str(tmp_path / "token")],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "needs TLS" in r.stderr

    d = Daemon(tmp_path)
    try:
        r = run(exe, "--address", d.grpc_address)
        assert r.stdout == "0 models\n"
        write_llama(tmp_path / "m", np.random.default_rng(3), layers=4)
        d.rvctl("measure", tmp_path / "m", "--model-id", "pkg-m", "--step", 12)
        r = run(exe, "--address", d.grpc_address)
        lines = r.stdout.splitlines()
        assert lines[0] == "1 models"
        assert lines[1].startswith("pkg-m step 12 R_V ")
        assert 0 < float(lines[1].split()[-1]) < 10
    finally:
        d.stop()
    # A daemon that is gone: the call fails, exit 1.
    r = subprocess.run([str(exe), "--address", d.grpc_address], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and "UNAVAILABLE" in r.stderr

    # The library's TLS, client certificate and token against rvd with all
    # three: with them the call goes through; a wrong token is refused.
    (tmp_path / "pki").mkdir()
    pki = make_pki(tmp_path / "pki")
    (pki / "token").write_text("pkg-token-42\n")
    (pki / "wrong").write_text("nope\n")
    creds = grpc.ssl_channel_credentials((pki / "ca.pem").read_bytes(),
                                         (pki / "client.key").read_bytes(),
                                         (pki / "client.pem").read_bytes())
    d = Daemon(tmp_path, credentials=creds,
               tls_cert_file=str(pki / "server.pem"), tls_key_file=str(pki / "server.key"),
               tls_client_ca_file=str(pki / "ca.pem"), auth_token_file=str(pki / "token"))
    try:
        tls = [exe, "--address", d.grpc_address, "--tls-ca-file", pki / "ca.pem",
               "--tls-cert-file", pki / "client.pem", "--tls-key-file", pki / "client.key"]
        r = run(*tls, "--auth-token-file", pki / "token")
        assert r.stdout == "0 models\n"
        r = subprocess.run([str(a) for a in tls] + ["--auth-token-file", str(pki / "wrong")],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and "UNAUTHENTICATED" in r.stderr
    finally:
        d.stop()
