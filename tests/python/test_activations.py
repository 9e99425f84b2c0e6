"""VActivationMonitor against the real rvd (MeasureActivations, copy
transport): each HF-shaped module's V activations, captured here by hooks
of the test's own (the models' own slicing), against numpy's float64 SVD;
layer selection and order, a new pass replacing the last, rank one, a zero
matrix, errors."""
import logging

import numpy as np
import pytest
import torch

import models
import rvd
from rvd import activations
from rvdtest import free_port


def reference(a):
    """The statistics by their definitions from numpy's SVD (float64)."""
    s = np.linalg.svd(np.asarray(a, dtype=np.float64), compute_uv=False)
    p = s[s > 0] / s.sum()
    h = float(-(p * np.log(p)).sum())
    s2 = s * s
    return {"frobenius_norm": float(np.sqrt(s2.sum())), "max_singular_value": float(s[0]),
            "entropy": h, "effective_rank": float(np.exp(h)),
            "participation_ratio": float(s2.sum() ** 2 / (s2 * s2).sum())}


def capture(model, modules, cut):
    """{layer: V activations as float64 numpy} of the next forward pass,
    through hooks of this test's own; cut(output) -> V (models.py's own
    slicing)."""
    got, handles = {}, []
    for l, m in modules.items():
        def hook(module, args, out, l=l):
            v = cut(out)
            got[l] = v.reshape(-1, v.shape[-1]).detach().double().numpy()
        handles.append(m.register_forward_hook(hook))
    return got, handles


def llama_modules(m):
    return {l: layer.self_attn.v_proj for l, layer in enumerate(m.model.layers)}


def neox_modules(m):
    return {l: layer.attention.query_key_value for l, layer in enumerate(m.gpt_neox.layers)}


def gpt2_modules(m):
    return {l: block.attn.c_attn for l, block in enumerate(m.transformer.h)}


def neox_cut(heads):
    def cut(out):
        d = out.shape[-1] // (3 * heads)
        return out.view(*out.shape[:-1], heads, 3, d)[..., 2, :].reshape(*out.shape[:-1], -1)
    return cut


CASES = {
    "llama": (lambda: models.LlamaForCausalLM(layers=4), llama_modules, lambda o: o, 64),
    "llama-bf16": (lambda: models.LlamaForCausalLM(layers=4, dtype=torch.bfloat16),
                   llama_modules, lambda o: o, 64),
    "gpt_neox": (lambda: models.GPTNeoXForCausalLM(layers=4, heads=4), neox_modules,
                 neox_cut(4), 32),
    "gpt2": (lambda: models.GPT2LMHeadModel(layers=4), gpt2_modules,
             lambda o: o.split(o.shape[-1] // 3, dim=-1)[2], 32),
}


@pytest.mark.parametrize("name", list(CASES))
def test_stats_match_numpy_svd_of_the_v_activations(daemon, seed, name):
    make, modules_of, cut, hidden = CASES[name]
    model = make()
    dtype = next(model.parameters()).dtype
    mon = rvd.VActivationMonitor(model, layer_indices=[2, 0, 3], address=daemon.grpc_address,
                                 on_error="raise")
    assert mon.layer_indices == [0, 2, 3]
    got, handles = capture(model, {l: m for l, m in modules_of(model).items() if l in (0, 2, 3)},
                           cut)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 7, hidden, generator=gen).to(dtype)
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    stats = mon.activation_stats
    assert [s.layer_idx for s in stats] == [0, 2, 3]
    for s in stats:
        a = got[s.layer_idx]
        assert (s.tokens, s.features) == a.shape == (21, a.shape[1])
        want = reference(a)
        for field, value in want.items():
            assert getattr(s, field) == pytest.approx(value, rel=1e-8, abs=1e-12), (
                name, s.layer_idx, field)
        assert 1.0 <= s.effective_rank <= min(a.shape)
    # Cached until the next pass: no second call for the same pass.
    assert mon.activation_stats == stats
    mon.remove()


def test_a_new_pass_replaces_the_last(daemon, seed):
    model = models.LlamaForCausalLM(layers=3)
    mon = rvd.VActivationMonitor(model, [1], address=daemon.grpc_address, on_error="raise")
    assert mon.activation_stats == []  # before any pass
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model(torch.randn(2, 5, 64, generator=gen))
        first = mon.activation_stats
        model(10.0 * torch.randn(4, 5, 64, generator=gen))
    second = mon.activation_stats
    assert mon.forward_passes == 2
    assert first[0].tokens == 10 and second[0].tokens == 20
    assert second[0].frobenius_norm > 3 * first[0].frobenius_norm
    mon.remove()
    with torch.no_grad():
        model(torch.randn(2, 5, 64, generator=gen))
    assert mon.forward_passes == 2  # hooks removed


def test_rank_one_and_zero_activations(daemon, seed):
    model = models.LlamaForCausalLM(layers=2)
    mon = rvd.VActivationMonitor(model, [0], address=daemon.grpc_address, on_error="raise",
                                 max_tokens=300)
    gen = torch.Generator().manual_seed(seed)
    u = torch.randn(512, 1, generator=gen)
    w = torch.randn(1, 64, generator=gen)
    with torch.no_grad():
        model((u * w).reshape(1, 512, 64))  # every token a multiple of one vector
    (s,) = mon.activation_stats
    assert s.tokens == 300  # max_tokens
    assert s.effective_rank == pytest.approx(1.0, abs=1e-9)
    assert s.entropy == pytest.approx(0.0, abs=1e-9)
    assert s.participation_ratio == pytest.approx(1.0, abs=1e-9)
    with torch.no_grad():
        model(torch.zeros(1, 4, 64))
    (z,) = mon.activation_stats
    assert (z.effective_rank, z.frobenius_norm, z.max_singular_value, z.entropy,
            z.participation_ratio) == (0.0, 0.0, 0.0, 0.0, 0.0)
    mon.remove()


def test_errors(daemon, caplog):
    model = models.LlamaForCausalLM(layers=2)
    with pytest.raises(ValueError, match="layers \\[5\\]"):
        rvd.VActivationMonitor(model, [0, 5], address=daemon.grpc_address)
    with pytest.raises(ValueError, match="IPC activations"):
        rvd.VActivationMonitor(model, [0], address=daemon.grpc_address, transport="ipc")

    # rvd refuses NaN, naming the layer.
    client = rvd.Client(daemon.grpc_address)
    bad = activations.encode(1, torch.tensor([[1.0, float("nan")], [0.0, 1.0]]))
    with pytest.raises(rvd.RvdError) as e:
        activations.measure_activations(client, "m", [bad])
    assert e.value.code_name == "INVALID_ARGUMENT"
    assert "activations[0] (layer 1)" in e.value.details and "NaN" in e.value.details
    # A shape the bytes do not hold.
    short = activations.encode(0, torch.ones(2, 3))
    short.shape[:] = [3, 3]
    with pytest.raises(rvd.RvdError, match="do not hold"):
        activations.measure_activations(client, "m", [short])

    # rvd unreachable: "warn" answers [] and keeps the error; "raise" raises.
    gone = f"127.0.0.1:{free_port()}"
    warn = rvd.VActivationMonitor(model, [0], address=gone, timeout=2.0)
    with torch.no_grad():
        model(torch.randn(1, 3, 64))
    with caplog.at_level(logging.WARNING, logger="rvd"):
        assert warn.activation_stats == []
    assert warn.last_error is not None and warn.last_error.unreachable
    assert "activation statistics failed" in caplog.text
    warn.remove()
    strict = rvd.VActivationMonitor(model, [0], address=gone, timeout=2.0, on_error="raise")
    with torch.no_grad():
        model(torch.randn(1, 3, 64))
    with pytest.raises(rvd.RvdError):
        strict.activation_stats
    strict.remove()


def test_large_passes_go_in_several_calls(daemon, seed):
    # 3 layers of 2048 x 1024 f32 (8 MiB each) exceed one call's 15 MiB.
    model = models.LlamaForCausalLM(layers=3, heads=16, kv_heads=16, hidden=1024,
                                    spectrum=False)
    mon = rvd.VActivationMonitor(model, address=daemon.grpc_address, on_error="raise")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model(torch.randn(2, 1024, 1024, generator=gen))
    stats = mon.activation_stats
    assert [s.layer_idx for s in stats] == [0, 1, 2]
    assert all((s.tokens, s.features) == (2048, 1024) for s in stats)
    assert all(500 < s.effective_rank < 1024 for s in stats)
    mon.remove()


def test_requests_are_logged_and_counted(daemon, seed):
    import urllib.request

    model = models.LlamaForCausalLM(layers=2)
    mon = rvd.VActivationMonitor(model, [0, 1], address=daemon.grpc_address,
                                 model_id="act-metrics", on_error="raise")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model(torch.randn(2, 6, 64, generator=gen))
    assert len(mon.activation_stats) == 2
    mon.remove()
    assert "activations model=act-metrics step=1 tensors=2 bytes=3072 backend=cpu" in \
        daemon.log_text()
    text = urllib.request.urlopen(f"http://{daemon.metrics_address}/metrics",
                                  timeout=5).read().decode()
    calls = [l for l in text.splitlines()
             if l.startswith("rvd_request_duration_seconds_count{")
             and "MeasureActivations" in l and 'code="OK"' in l]
    assert calls and float(calls[0].split()[-1]) >= 1, calls


def test_max_request_bytes_bounds_a_call(tmp_path):
    from daemons import start_daemon

    d = start_daemon(tmp_path, max_request_bytes=2048)
    try:
        model = models.LlamaForCausalLM(layers=2)
        mon = rvd.VActivationMonitor(model, [0, 1], address=d.grpc_address, on_error="raise")
        with torch.no_grad():
            model(torch.randn(2, 6, 64))  # 2 x 1536 bytes
        with pytest.raises(rvd.RvdError) as e:
            mon.activation_stats
        assert e.value.code_name == "RESOURCE_EXHAUSTED"
        assert "3072 bytes exceed max_request_bytes (2048)" in e.value.details
        mon.remove()
        one = rvd.VActivationMonitor(model, [1], address=d.grpc_address, on_error="raise")
        with torch.no_grad():
            model(torch.randn(2, 6, 64))
        assert [s.layer_idx for s in one.activation_stats] == [1]
        one.remove()
    finally:
        d.stop()


def test_numpy_matrices_without_hooks(daemon, seed):
    rng = np.random.default_rng(seed)
    mats = {4: rng.standard_normal((50, 20)),                      # float64: sent as f32
            1: rng.standard_normal((8, 90)).astype(np.float16)}
    stats = activations.activation_stats(rvd.Client(daemon.grpc_address), "np-model", mats)
    assert [s.layer_idx for s in stats] == [1, 4]
    for s in stats:
        a = mats[s.layer_idx]
        sent = a.astype(np.float32) if a.dtype == np.float64 else a
        for field, value in reference(sent).items():
            assert getattr(s, field) == pytest.approx(value, rel=1e-8), (s.layer_idx, field)
        assert (s.tokens, s.features) == a.shape
    with pytest.raises(ValueError, match="2-D"):
        activations.encode(0, np.ones(3))
