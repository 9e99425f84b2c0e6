"""The daemon on a GPU host (ctest label gpu): rvd loads librvd_cuda.so at
run time, serves measurements with the CUDA backend, and says so in the
log and /metrics. Skipped where no GPU is visible."""
import json
import pathlib
import shutil
import subprocess
import sys
import urllib.request

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "integration"))
from rvdtest import Daemon, pr_oracle, to_bf16, write_safetensors  # noqa: E402
import health_pb2  # noqa: E402
import health_pb2_grpc  # noqa: E402


def gpu_present():
    smi = shutil.which("nvidia-smi")
    return smi is not None and subprocess.run([smi, "-L"], capture_output=True).returncode == 0


pytestmark = pytest.mark.skipif(not gpu_present(), reason="no GPU visible")


def write_bf16_llama(path, rng, layers=8, kv_heads=4, head_dim=64, hidden=512):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": layers, "num_attention_heads": 8,
        "num_key_value_heads": kv_heads, "hidden_size": hidden}))
    vs, tensors = {}, {}
    for l in range(layers):
        w = rng.standard_normal((kv_heads * head_dim, hidden)).astype(np.float32)
        w *= (np.arange(1, hidden + 1) ** -(0.1 * l)).astype(np.float32)
        vs[l], bits = to_bf16(w)
        tensors[f"model.layers.{l}.self_attn.v_proj.weight"] = ("BF16", bits)
    write_safetensors(path / "model.safetensors", tensors)
    return vs


@pytest.mark.parametrize("backend", ["cuda", "auto"])
def test_daemon_serves_with_the_cuda_module(tmp_path, backend):
    d = Daemon(tmp_path, backend=backend)
    try:
        assert "backend cuda" in d.log_text()
        health = health_pb2_grpc.HealthStub(d.channel)
        assert health.Check(health_pb2.HealthCheckRequest(service="rvd.backend.cuda")).status \
            == health_pb2.HealthCheckResponse.SERVING
        vs = write_bf16_llama(tmp_path / "m", np.random.default_rng(0))
        for variant in ["", "fused", "algebraic", "naive"]:
            args = ["measure", tmp_path / "m", "--model-id", "gpu", "--per-head", "--json"]
            if variant:
                args += ["--variant", variant]
            out = json.loads(d.rvctl(*args).stdout)
            assert out["backend"] == "cuda"
            assert out["variant"] == (variant or "fused")
            for l, pr in out["per_layer_pr"].items():
                want = pr_oracle(vs[int(l)])
                assert abs(pr - want) <= 2e-6 * want, (variant, l, pr, want)
            for l, heads in out["per_head_pr"].items():
                for h, pr in enumerate(heads):
                    want = pr_oracle(vs[int(l)][h * 64:(h + 1) * 64])
                    assert abs(pr - want) <= 2e-6 * want, (variant, l, h)
        metrics = urllib.request.urlopen(
            f"http://{d.metrics_address}/metrics", timeout=5).read().decode()
        assert 'rvd_measurements_total{backend="cuda",model_id="gpu",variant="fused"} 2' in metrics
        # The fused kernel that served: on sm_90 v4 takes these aligned bf16
        # matrices, 2 fused measurements x (8 layers + 32 heads): the layers
        # (Gram side > 128) on its square kernel, the 64-row heads on its
        # triangle.
        served = {l.split('path="')[1].split('"')[0]: float(l.split()[-1])
                  for l in metrics.splitlines()
                  if l.startswith('rvd_engine_matrices_total{backend="cuda"')}
        fused = {p: n for p, n in served.items() if p.startswith("fused/")}
        assert sum(fused.values()) == 80, served
        if "sm90" in out["engine_version"]:
            assert fused.get("fused/tma-wgmma-square") == 16, served
            assert fused.get("fused/tma-wgmma-triangle") == 64, served
        assert "served_total=" in d.log_text()
        assert 'backend="cuda"' in next(l for l in metrics.splitlines()
                                        if l.startswith("rvd_build_info"))
        assert "engine=cuda" in d.log_text()
    finally:
        assert d.stop() == 0


def write_f32_llama(path, layers):
    """A llama checkpoint whose V projections are `layers` (f32 arrays)."""
    path.mkdir(parents=True)
    rows, hidden = layers[0].shape
    (path / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": len(layers), "num_attention_heads": 32,
        "num_key_value_heads": rows // 128, "head_dim": 128, "hidden_size": hidden}))
    write_safetensors(path / "model.safetensors", {
        f"model.layers.{l}.self_attn.v_proj.weight": w for l, w in enumerate(layers)})


def test_chunked_checkpoint_gives_each_layer_its_own_pr(tmp_path):
    """Issue 14's case through rvctl: six distinct 512 x 4096 f32 layers in one
    checkpoint, a 64 MiB device cap and 4 streams, so the batch is cut into
    chunks over two contexts. Every variant must give each layer what it
    gives that layer alone (power_iter and sketch gave every layer the next
    layer's PR), and a small cap must not fail the call (algebraic and naive
    were RESOURCE_EXHAUSTED)."""
    rng = np.random.default_rng(14)
    layers = []
    for l in range(6):
        w = rng.standard_normal((512, 4096)).astype(np.float32)
        if l % 3 == 0:  # nearly rank 1
            w = np.outer(rng.standard_normal(512), rng.standard_normal(4096)).astype(np.float32) \
                + 1e-3 * w
        else:
            w *= (np.arange(1, 4097) ** -(0.3 * l)).astype(np.float32)
        layers.append(w)
    write_f32_llama(tmp_path / "all", layers)
    for l, w in enumerate(layers):
        write_f32_llama(tmp_path / f"alone{l}", [w])
    d = Daemon(tmp_path, backend="cuda", cuda_max_device_bytes=64 << 20, cuda_streams=4)
    failures = []  # every variant is tried: one failing says nothing of the next
    try:
        for variant in ["fused", "algebraic", "naive", "power_iter", "sketch"]:
            common = ["--variant", variant, "--seed", "7", "--json"]
            r = d.rvctl("measure", tmp_path / "all", "--model-id", "all", *common, check=False)
            if r.returncode != 0:
                failures.append((variant, "batch", r.stderr.strip()))
                continue
            batch = json.loads(r.stdout)["per_layer_pr"]
            for l, w in enumerate(layers):
                alone = json.loads(d.rvctl("measure", tmp_path / f"alone{l}", "--model-id",
                                           f"alone{l}", *common).stdout)["per_layer_pr"]["0"]
                got = batch[str(l)]
                if variant in ("fused", "algebraic", "naive"):
                    want = pr_oracle(w)
                    if abs(got - want) > 2e-6 * want or abs(got - alone) > 4e-6 * alone:
                        failures.append((variant, l, got, alone, want))
                elif abs(got - alone) > 1e-9 * alone:
                    failures.append((variant, l, got, alone))
    finally:
        assert d.stop() == 0
    assert not failures, failures
