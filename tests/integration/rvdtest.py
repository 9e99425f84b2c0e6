"""Helpers shared by the integration tests and the benchmarks: start the real
rvd on loopback, write checkpoints, compute the float64 SVD oracle.

The tests run with Debian's /usr/bin/python3 (grpcio, protobuf, numpy,
pytest). RVD_BUILD_DIR names the CMake build directory (default ./build);
the generated Python stubs live in $RVD_BUILD_DIR/python.
"""
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

BUILD = pathlib.Path(os.environ.get("RVD_BUILD_DIR", "build")).resolve()
sys.path.insert(0, str(BUILD / "python"))

import grpc  # noqa: E402
import health_pb2  # noqa: E402
import health_pb2_grpc  # noqa: E402
from rvd.v1 import rvd_pb2, rvd_pb2_grpc  # noqa: E402

RVD = BUILD / "bin" / "rvd"
# Sanitizer builds (make asan sets ASAN_OPTIONS) run several times slower:
# the tests' time bounds are multiplied by this.
TIME_SCALE = 3.0 if "ASAN_OPTIONS" in os.environ else 1.0
RVCTL = BUILD / "bin" / "rvctl"


class ExitWithoutGrpcShutdown:
    """A pytest plugin (registered by each conftest's pytest_configure): once
    pytest is done, the process exits with its status at once. Debian 12's
    grpcio (1.51) shuts gRPC down at interpreter exit and that can wait for
    its thread pool forever: seen once in CI, where every test of
    tests/python had passed and the process then logged "Waiting for thread
    pool to idle before shutting down" every 3 s until ctest's timeout. The
    results are final by then; nothing after them is worth that risk."""

    status = 0

    def pytest_sessionfinish(self, session, exitstatus):
        self.status = int(exitstatus)

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self, config):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(self.status)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """One rvd process on free loopback ports, with a temporary config."""

    def __init__(self, tmp, credentials=None, rvctl_args=(), **config):
        """credentials: grpc.ChannelCredentials for a daemon with TLS (the
        test's channel uses them); rvctl_args: flags rvctl() passes too."""
        self.rvctl_args = list(rvctl_args)
        self.grpc_address = f"127.0.0.1:{free_port()}"
        self.metrics_address = f"127.0.0.1:{free_port()}"
        cfg = {"grpc_address": self.grpc_address,
               "metrics_address": self.metrics_address,
               "backend": "cpu",
               "engine_threads": 2, "compute_workers": 2}
        cfg.update(config)
        # A test may bind elsewhere (0.0.0.0:PORT); the client dials loopback.
        self.grpc_address = cfg["grpc_address"].replace("0.0.0.0", "127.0.0.1")
        self.config_path = tmp / f"rvd-{free_port()}.yaml"
        self.config_path.write_text(
            "".join(f"{k}: {json.dumps(v)}\n" for k, v in cfg.items()))
        self.log_path = tmp / (self.config_path.stem + ".log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([str(RVD), "--config", str(self.config_path)],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        options = [("grpc.max_receive_message_length", 64 << 20),
                   ("grpc.max_send_message_length", 64 << 20)]
        if credentials is None:
            self.channel = grpc.insecure_channel(self.grpc_address, options=options)
        else:
            self.channel = grpc.secure_channel(self.grpc_address, credentials,
                                               options=options)
        self.stub = rvd_pb2_grpc.RvdStub(self.channel)
        self.wait_serving()

    def wait_serving(self, timeout=20):
        health = health_pb2_grpc.HealthStub(self.channel)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"rvd exited: {self.log_text()}")
            try:
                r = health.Check(health_pb2.HealthCheckRequest(service="rvd.v1.Rvd"),
                                 timeout=1)
                if r.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"rvd did not become healthy: {self.log_text()}")

    def log_text(self):
        self.log.flush()
        return self.log_path.read_text()

    def rvctl(self, *args, check=True, env=None):
        r = subprocess.run([str(RVCTL), "--address", self.grpc_address,
                            *self.rvctl_args, *map(str, args)],
                           capture_output=True, text=True, timeout=120, env=env)
        if check and r.returncode != 0:
            raise AssertionError(f"rvctl {args} failed ({r.returncode}): {r.stderr}")
        return r

    def stop(self, sig=signal.SIGTERM, timeout=10):
        self.channel.close()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=timeout)
        self.log.close()
        return self.proc.returncode


# ---- checkpoints -----------------------------------------------------------

SAFETENSORS_DTYPE = {np.float32: "F32", np.float16: "F16", np.int64: "I64"}


def scrape(daemon):
    """The text of the daemon's /metrics."""
    url = f"http://{daemon.metrics_address}/metrics"
    return urllib.request.urlopen(url, timeout=5).read().decode()


def metric(text, name, **labels):
    """The value of the series `name` with exactly `labels` in the
    exposition text `text`, or None."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = re.match(r"^([a-z_]+)(\{[^}]*\})?\s+(\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = ",".join(sorted((m.group(2) or "{}")[1:-1].split(","))) if m.group(2) else ""
        if got == want:
            return float(m.group(3))
    return None


def write_safetensors(path, tensors):
    """tensors: name -> numpy array (f32, f16, i64) or ('BF16', uint16 array)."""
    header, blobs, offset = {}, [], 0
    for name, value in tensors.items():
        if isinstance(value, tuple):
            dtype, arr = value
        else:
            arr = np.ascontiguousarray(value)
            dtype = SAFETENSORS_DTYPE[arr.dtype.type]
        blob = arr.tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def to_bf16(a):
    """Rounds float32 to bfloat16 (nearest even); returns (values, bits)."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return (rounded.astype(np.uint32) << 16).view(np.float32), rounded


def spectrum_matrix(rng, rows, cols, decay):
    """A random matrix whose singular values fall off as i^-decay."""
    k = min(rows, cols)
    u, _ = np.linalg.qr(rng.standard_normal((rows, k)))
    v, _ = np.linalg.qr(rng.standard_normal((cols, k)))
    s = np.arange(1, k + 1, dtype=np.float64) ** -decay
    return ((u * s) @ v.T).astype(np.float32)


def pr_oracle(w):
    s = np.linalg.svd(np.asarray(w, dtype=np.float64), compute_uv=False)
    s2 = s * s
    return float(s2.sum() ** 2 / (s2 * s2).sum())


def write_llama(path, rng, layers=8, heads=4, kv_heads=2, head_dim=16, hidden=64,
                shards=1):
    """A llama-style checkpoint; returns {layer: V (f32)}."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "hidden_size": hidden}))
    vs, tensors = {}, {}
    for l in range(layers):
        vs[l] = spectrum_matrix(rng, kv_heads * head_dim, hidden, 0.2 + 0.15 * l)
        tensors[f"model.layers.{l}.self_attn.v_proj.weight"] = vs[l]
        tensors[f"model.layers.{l}.self_attn.q_proj.weight"] = \
            rng.standard_normal((heads * head_dim, hidden)).astype(np.float32)
    tensors["model.embed_tokens.weight"] = np.arange(12, dtype=np.int64).reshape(3, 4)
    if shards == 1:
        write_safetensors(path / "model.safetensors", tensors)
        return vs
    names = list(tensors)
    weight_map = {}
    for i in range(shards):
        part = {n: tensors[n] for n in names[i::shards]}
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(path / fname, part)
        weight_map.update({n: fname for n in part})
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
    return vs
