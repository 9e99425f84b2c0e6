"""The plain client (numpy, no torch) against the real rvd."""
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import rvd
from rvdtest import pr_oracle, spectrum_matrix, to_bf16

ROOT = pathlib.Path(__file__).resolve().parents[2]


def rel(a, b):
    return abs(a - b) / abs(b)


def geomean(xs):
    return float(np.exp(np.mean(np.log(xs))))


def test_measure_dtypes_and_layer_sets(daemon, seed):
    rng = np.random.default_rng(seed)
    c = rvd.Client(daemon.grpc_address)
    vs = {l: spectrum_matrix(rng, 32, 48, 0.2 + 0.2 * l) for l in range(4)}
    bf16_values, bf16_bits = to_bf16(vs[2])
    tensors = [rvd.Tensor(0, vs[0]),
               rvd.Tensor(1, vs[1].astype(np.float16)),
               rvd.Tensor(2, bf16_bits, dtype="bf16"),
               rvd.Tensor(3, vs[3].tobytes(), dtype="f32", shape=(32, 48),
                          num_heads=4, num_kv_heads=2, head_dim=16, name="v3")]
    m = c.measure("plain-dtypes", tensors, step=7, early_layers=[0, 1],
                  late_layers=[2, 3], per_head=True)
    oracle = {0: pr_oracle(vs[0]), 1: pr_oracle(vs[1].astype(np.float16)),
              2: pr_oracle(bf16_values), 3: pr_oracle(vs[3])}
    for l in range(4):
        assert rel(m.per_layer_pr[l], oracle[l]) < 1e-5, l
    assert rel(m.rv, geomean([oracle[2], oracle[3]]) / geomean([oracle[0], oracle[1]])) < 1e-5
    assert (m.step, m.early_layers, m.late_layers) == (7, [0, 1], [2, 3])
    assert m.tensor_names[3] == "v3"
    heads = [pr_oracle(vs[3][h * 16:(h + 1) * 16]) for h in range(2)]
    assert all(rel(a, b) < 1e-5 for a, b in zip(m.per_head_pr[3], heads))
    assert m.sequence > 0 and m.timestamp > 1.6e9

    latest = c.latest("plain-dtypes")
    assert (latest.sequence, latest.per_layer_pr) == (m.sequence, m.per_layer_pr)
    m2 = c.measure("plain-dtypes", tensors[:1] + tensors[3:], step=8)
    hist = c.history("plain-dtypes")
    assert [h.step for h in hist] == [7, 8]
    assert [h.step for h in c.history("plain-dtypes", limit=1)] == [8]
    # Default quarters of two layers: early [0], late [3].
    assert (m2.early_layers, m2.late_layers) == ([0], [3])
    summary = {s.model_id: s for s in c.models()}["plain-dtypes"]
    assert summary.measurements == 2 and summary.latest.step == 8


def test_large_tensor_goes_by_stream(daemon, seed):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((1024, 2304)).astype(np.float32)  # 9.4 MB: > one message
    assert w.nbytes > rvd.client.UNARY_MAX_BYTES
    m = rvd.Client(daemon.grpc_address).measure("plain-stream", [rvd.Tensor(0, w)])
    assert rel(m.per_layer_pr[0], pr_oracle(w)) < 1e-5
    assert m.receive_ms > 0  # only a stream has a receive time


def test_errors_carry_code_and_message(daemon):
    c = rvd.Client(daemon.grpc_address)
    with pytest.raises(rvd.RvdError) as e:
        c.latest("never-measured")
    assert e.value.code_name == "NOT_FOUND" and e.value.method == "GetLatest"
    w = np.ones((8, 8), np.float32)
    with pytest.raises(rvd.RvdError) as e:
        c.measure("bad id!", [rvd.Tensor(0, w)])
    assert e.value.code_name == "INVALID_ARGUMENT" and "model_id" in e.value.details
    with pytest.raises(rvd.RvdError) as e:  # 8 rows are not 2 kv heads of 8
        c.measure("plain-err", [rvd.Tensor(0, w, num_heads=2, num_kv_heads=2,
                                           head_dim=8, name="wrong.v")])
    assert e.value.code_name == "INVALID_ARGUMENT" and "wrong.v" in e.value.details
    assert "INVALID_ARGUMENT" in str(e.value)
    with pytest.raises(ValueError, match="needs num_heads"):
        rvd.Tensor(0, w, layout="gpt_neox_qkv").encode()
    with pytest.raises(ValueError, match="float64"):
        rvd.Tensor(0, w.astype(np.float64)).encode()
    with pytest.raises(ValueError, match="unknown V layout"):
        rvd.Tensor(0, w, layout="nope", num_heads=1, num_kv_heads=1, head_dim=8).encode()


def test_unreachable_is_unavailable():
    from rvdtest import free_port
    c = rvd.Client(f"127.0.0.1:{free_port()}", timeout=5)
    with pytest.raises(rvd.RvdError) as e:
        c.models()
    assert e.value.code_name == "UNAVAILABLE" and e.value.unreachable


def test_watch(daemon, seed):
    rng = np.random.default_rng(seed)
    c = rvd.Client(daemon.grpc_address)
    first = c.measure("plain-watch", [rvd.Tensor(0, rng.standard_normal((8, 16)).astype(np.float32))])
    watch = c.watch("plain-watch", after_sequence=first.sequence - 1)
    events = iter(watch)
    got = next(events)
    assert isinstance(got, rvd.Measurement) and got.sequence == first.sequence
    second = c.measure("plain-watch", [rvd.Tensor(0, rng.standard_normal((8, 16)).astype(np.float32))], step=1)
    got = next(events)
    assert (got.sequence, got.step) == (second.sequence, 1)
    watch.cancel()
    assert list(events) == []  # a cancelled watch ends quietly


def test_without_torch(daemon):
    """The plain client works where torch cannot be imported; the monitor
    says what it needs."""
    code = f"""
import sys
sys.modules['torch'] = None
sys.path.insert(0, {str(ROOT / 'client' / 'python')!r})
import numpy as np, rvd
m = rvd.Client({daemon.grpc_address!r}).measure('no-torch', [rvd.Tensor(0, np.eye(6, 9, dtype=np.float32))])
assert abs(m.per_layer_pr[0] - 6) < 1e-6, m
assert rvd.compute_pr_algebraic(np.eye(3)) == 3
try:
    rvd.RVMonitor
except ImportError as e:
    print('monitor:', e)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    assert "monitor:" in r.stdout and "torch" in r.stdout
