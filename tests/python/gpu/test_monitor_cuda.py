"""RVMonitor with CUDA weights and a CUDA rvd (ctest python_client_gpu,
label gpu), transport="copy" (auto would take ipc: test_ipc_cuda.py): the
copy transport reads the weights off the GPU, the delta
trigger runs on the GPU, rvd's fused kernel measures; every recorded PR
against a float64 SVD of that step's weights, the policy step for step.
Skipped where torch sees no GPU."""
import pathlib
import sys

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
from policy import perturb_, simulate  # noqa: E402
from rvdtest import pr_oracle  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def rel(a, b):
    return abs(a - b) / abs(b)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_training_on_cuda(tmp_path, dtype):
    d = start_daemon(tmp_path, backend="cuda")
    try:
        torch.manual_seed(0)
        model = models.LlamaForCausalLM(layers=8, heads=8, kv_heads=4, hidden=512,
                                        dtype=dtype).cuda()
        layers = [0, 1, 6, 7]
        mon = rvd.RVMonitor(model, early_layers=[0, 1], late_layers=[6, 7],
                            mode="training", measurement_interval=5, adaptive=True,
                            delta_threshold=0.05, per_head=True, on_error="raise",
                            address=d.grpc_address, transport="copy")
        direction = {}
        for l in range(8):
            x = torch.randn_like(model.model.layers[l].self_attn.v_proj.weight,
                                 dtype=torch.float32)
            direction[l] = (x / x.norm()).to(dtype)
        sizes = [None, 0.02, 0.02, 0.02, 0, 0.02, 0.2, 0, 0.02, 0.02, 0.02, 0.02]
        updates = [{l: models.llama_v(model, l) for l in layers}]
        for n in range(1, len(sizes)):
            if sizes[n]:
                perturb_(model, layers, direction, sizes[n])
            mon.step()
            updates.append({l: models.llama_v(model, l) for l in layers})
        expected = simulate(updates, 5, 0.05, layers)
        assert [(r.step, r.trigger) for r in mon.history] == \
            [(s, t) for s, t, _ in expected]
        for r in mon.history:
            for l in layers:
                v = updates[r.step][l]
                assert rel(r.per_layer_pr[l], pr_oracle(v)) < 1e-5, (r.step, l)
                for h in range(4):
                    assert rel(r.per_head_pr[l][h], pr_oracle(v[64 * h:64 * (h + 1)])) < 1e-5
        served = rvd.Client(d.grpc_address).history(mon.model_id)
        assert [m.step for m in served] == [s for s, _, _ in expected]
        assert {m.backend for m in served} == {"cuda"}
    finally:
        d.stop()


def test_compute_pr_algebraic_on_cuda():
    w = torch.randn(64, 300, device="cuda", dtype=torch.bfloat16)
    assert rel(rvd.compute_pr_algebraic(w), pr_oracle(w.double().cpu().numpy())) < 1e-10
