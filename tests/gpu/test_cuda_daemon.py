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
            assert fused.get("fused/fused-v4-tma-wgmma-bt128s6c8w16d3p8") == 16, served
            assert fused.get("fused/fused-v4-triangle-tma-wgmma-3x64s6c4") == 64, served
        assert "served_total=" in d.log_text()
        assert 'backend="cuda"' in next(l for l in metrics.splitlines()
                                        if l.startswith("rvd_build_info"))
        assert "engine=cuda" in d.log_text()
    finally:
        assert d.stop() == 0
