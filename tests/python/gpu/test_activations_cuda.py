"""VActivationMonitor with a CUDA model and a CUDA rvd (ctest
python_client_gpu, label gpu): the hooks copy V activations on the GPU,
the copy transport brings them to rvd, whose module computes the Gram's
eigenvalues with cuBLAS and cuSOLVER (served as gram_eigen/...); every
statistic against numpy's float64 SVD of the same activations. Skipped
where torch sees no GPU."""
import pathlib
import sys
import urllib.request

import numpy as np
import pytest
import torch

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]
for p in (ROOT / "client" / "python", ROOT / "tests" / "integration", HERE.parent):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import models  # noqa: E402
import rvd  # noqa: E402
from daemons import start_daemon  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def reference(a):
    s = np.linalg.svd(np.asarray(a, dtype=np.float64), compute_uv=False)
    p = s[s > 0] / s.sum()
    h = float(-(p * np.log(p)).sum())
    s2 = s * s
    return {"frobenius_norm": float(np.sqrt(s2.sum())), "max_singular_value": float(s[0]),
            "entropy": h, "effective_rank": float(np.exp(h)),
            "participation_ratio": float(s2.sum() ** 2 / (s2 * s2).sum())}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_activation_stats_on_cuda(tmp_path, dtype):
    d = start_daemon(tmp_path, backend="cuda")
    try:
        torch.manual_seed(0)
        model = models.LlamaForCausalLM(layers=4, heads=8, kv_heads=4, hidden=512,
                                        dtype=dtype).cuda()
        mon = rvd.VActivationMonitor(model, [0, 3], address=d.grpc_address, on_error="raise")
        got = {}
        handles = [model.model.layers[l].self_attn.v_proj.register_forward_hook(
            lambda m, a, o, l=l: got.__setitem__(l, o.reshape(-1, o.shape[-1]).double().cpu()
                                                 .numpy()))
                   for l in (0, 3)]
        with torch.no_grad():
            model(torch.randn(4, 256, 512, device="cuda").to(dtype))
        for h in handles:
            h.remove()
        stats = mon.activation_stats
        assert [s.layer_idx for s in stats] == [0, 3]
        for s in stats:
            a = got[s.layer_idx]
            assert (s.tokens, s.features) == a.shape == (1024, 256)
            for field, value in reference(a).items():
                assert getattr(s, field) == pytest.approx(value, rel=1e-8), (s.layer_idx, field)
        mon.remove()
        metrics = urllib.request.urlopen(f"http://{d.metrics_address}/metrics",
                                         timeout=5).read().decode()
        served = [l for l in metrics.splitlines()
                  if l.startswith('rvd_engine_matrices_total{backend="cuda"')
                  and "gram_eigen/cublas-dsyrk-cusolver-dsyevd" in l]
        assert served and float(served[0].split()[-1]) >= 2, served
    finally:
        d.stop()
