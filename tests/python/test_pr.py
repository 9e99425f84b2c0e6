"""compute_pr_algebraic, MeasuredLinear, replace_v_proj_layers against a
float64 SVD (no daemon)."""
import numpy as np
import pytest
import torch

import models
import rvd
from rvdtest import pr_oracle


def rel(a, b):
    return abs(a - b) / abs(b)


@pytest.mark.parametrize("shape", [(16, 64), (64, 16), (33, 33), (1, 50), (50, 1)])
def test_pr_matches_svd(seed, shape):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(shape) * rng.uniform(0.1, 3, size=shape[1])
    assert rel(rvd.compute_pr_algebraic(w), pr_oracle(w)) < 1e-12
    t = torch.from_numpy(w.astype(np.float32))
    assert rel(rvd.compute_pr_algebraic(t), pr_oracle(t.double().numpy())) < 1e-10


def test_pr_bf16_tensor_is_that_of_its_values(seed):
    gen = torch.Generator().manual_seed(seed)
    t = torch.randn(24, 40, generator=gen).to(torch.bfloat16)
    assert rel(rvd.compute_pr_algebraic(t), pr_oracle(t.double().numpy())) < 1e-10


def test_pr_bounds_and_zero():
    u = np.arange(1.0, 9.0)
    assert rvd.compute_pr_algebraic(np.outer(u, u + 1)) == pytest.approx(1.0, rel=1e-12)
    assert rvd.compute_pr_algebraic(np.eye(7)) == pytest.approx(7.0, rel=1e-12)
    assert rvd.compute_pr_algebraic(np.zeros((4, 5))) == 0.0
    with pytest.raises(ValueError, match="2-D"):
        rvd.compute_pr_algebraic(np.ones(5))
    with pytest.raises(ValueError, match="2-D"):
        rvd.compute_pr_algebraic(torch.ones(2, 3, 4))


def test_measured_linear_once_per_weight_version(seed):
    torch.manual_seed(seed)
    lin = torch.nn.Linear(20, 12)
    m = rvd.MeasuredLinear.from_linear(lin)
    assert m.weight is lin.weight and m.bias is lin.bias and m.last_pr is None
    x = torch.randn(5, 20)
    assert torch.equal(m(x), lin(x))
    assert rel(m.last_pr, pr_oracle(lin.weight.detach().double().numpy())) < 1e-10
    m(x)
    m(x)
    assert m.pr_computations == 1  # the same weight version: not measured again
    assert list(m.state_dict()) == ["weight", "bias"]  # nothing registered besides
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    before = m.last_pr
    m(x).square().sum().backward()
    opt.step()
    m(x)
    assert m.pr_computations == 2
    assert m.last_pr != before
    assert rel(m.last_pr, pr_oracle(m.weight.detach().double().numpy())) < 1e-10


def test_replace_v_proj_layers_llama(seed):
    model = models.LlamaForCausalLM(seed=seed % 1000)
    x = torch.randn(3, 64)
    expected = model(x)
    replaced = rvd.replace_v_proj_layers(model)
    assert sorted(replaced) == list(range(6))
    assert torch.allclose(model(x), expected)
    for i, layer in enumerate(model.model.layers):
        v = layer.self_attn.v_proj
        assert isinstance(v, rvd.MeasuredLinear) and replaced[i] is v
        assert rel(v.last_pr, pr_oracle(models.llama_v(model, i))) < 1e-10
    # Twice: the layers already replaced are kept.
    assert rvd.replace_v_proj_layers(model)[0] is replaced[0]


def test_replace_v_proj_layers_refuses_fused():
    with pytest.raises(ValueError, match="gpt_neox_qkv.*RVMonitor"):
        rvd.replace_v_proj_layers(models.GPTNeoXForCausalLM())
    with pytest.raises(TypeError):
        rvd.MeasuredLinear.from_linear(torch.nn.Conv1d(2, 2, 1))
