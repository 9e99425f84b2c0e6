"""RVMonitor against the real rvd (copy transport): results vs a float64 SVD
for each HF-shaped module, the trigger policy step for step, exports and
summary, errors, a daemon that goes away and comes back."""
import csv
import json
import logging
import sys
import types

import numpy as np
import pytest
import torch

import models
import rvd
from rvd import architectures
import grpc
from daemons import start_daemon
from policy import perturb_, simulate
from rvdtest import free_port, pr_oracle


def rel(a, b):
    return abs(a - b) / abs(b)


def geomean(xs):
    return float(np.exp(np.mean(np.log(xs))))


def server_steps(daemon, model_id):
    return [m.step for m in rvd.Client(daemon.grpc_address).history(model_id)]


# ---- results -----------------------------------------------------------------

@pytest.mark.parametrize("make,v_of", [
    (models.LlamaForCausalLM, models.llama_v),
    (lambda: models.LlamaForCausalLM(dtype=torch.bfloat16), models.llama_v),
    (models.GPTNeoXForCausalLM, models.neox_v),
    (models.GPT2LMHeadModel, models.gpt2_v),
    (models.CustomNet, lambda m, l: m.blocks[l].value.weight.detach().double().numpy()),
])
def test_pr_and_rv_match_svd(daemon, make, v_of):
    model = make()
    n = len(architectures.resolve(model).tensors)
    early, late = ([0, 1], [n - 2, n - 1]) if n >= 4 else ([0], [n - 1])
    mon = rvd.RVMonitor(model, early_layers=early, late_layers=late,
                        address=daemon.grpc_address)
    (m,) = mon.history
    oracle = {l: pr_oracle(v_of(model, l)) for l in mon.layers}
    assert set(m.per_layer_pr) == set(mon.layers)
    for l in mon.layers:
        assert rel(m.per_layer_pr[l], oracle[l]) < 1e-5, l
    want = geomean([oracle[l] for l in mon.late_layers]) / \
        geomean([oracle[l] for l in mon.early_layers])
    assert rel(mon.rv, want) < 1e-5
    assert server_steps(daemon, mon.model_id) == [0]


def test_per_head_gqa_and_fused(daemon):
    llama = models.LlamaForCausalLM()  # 4 query heads, 2 kv heads of 16 rows
    mon = rvd.RVMonitor(llama, address=daemon.grpc_address, per_head=True)
    for l in mon.layers:
        v = models.llama_v(llama, l)
        heads = mon.history[0].per_head_pr[l]
        assert len(heads) == 2
        for h in range(2):
            assert rel(heads[h], pr_oracle(v[16 * h:16 * (h + 1)])) < 1e-5
    neox = models.GPTNeoXForCausalLM()
    mon = rvd.RVMonitor(neox, address=daemon.grpc_address, per_head=True)
    for l in mon.layers:
        got = mon.history[0].per_head_pr[l]
        want = [pr_oracle(h) for h in models.neox_v_heads(neox, l)]
        assert len(got) == 4 and all(rel(a, b) < 1e-5 for a, b in zip(got, want))
    with pytest.raises(ValueError, match="per_head needs the head geometry"):
        rvd.RVMonitor(models.CustomNet(), address=daemon.grpc_address, per_head=True)


# ---- the policy, step for step ------------------------------------------------

def test_inference_mode_measures_once(daemon):
    model = models.LlamaForCausalLM()
    mon = rvd.RVMonitor(model, early_layers=[0], late_layers=[5],
                        address=daemon.grpc_address)
    first = mon.rv
    assert mon.mode == "inference" and [(r.step, r.trigger) for r in mon.history] == \
        [(None, "registration")]
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(5):
        opt.zero_grad()
        model(torch.randn(2, 64)).mean().backward()
        opt.step()
        assert mon.step() == first  # served from the cache, weights or not
    assert len(mon.history) == 1 and server_steps(daemon, mon.model_id) == [0]
    now = mon.measure_now()
    assert now is not None and now != first
    assert [r.trigger for r in mon.history] == ["registration", "manual"]
    assert rel(mon.history[-1].per_layer_pr[5], pr_oracle(models.llama_v(model, 5))) < 1e-5


def test_training_interval_and_unchanged_weights(daemon):
    model = models.LlamaForCausalLM()
    mon = rvd.RVMonitor(model, early_layers=[0, 1], late_layers=[4, 5],
                        mode="training", measurement_interval=3,
                        address=daemon.grpc_address)
    sends = []
    real = mon.client.measure_encoded
    mon.client.measure_encoded = lambda *a, **k: sends.append(mon.steps) or real(*a, **k)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    no_update = {4, 5, 6}   # step 6 is due but nothing changed since step 3
    only_unmonitored = {10, 11, 12}  # layer 2 changes: not a monitored V
    for n in range(1, 16):
        if n in only_unmonitored:
            with torch.no_grad():
                model.model.layers[2].self_attn.v_proj.weight.mul_(1.5)
        elif n not in no_update:
            opt.zero_grad()
            model(torch.randn(4, 64)).mean().backward()
            opt.step()
        mon.step()
        if n == 9:
            kept = {l: models.llama_v(model, l) for l in mon.layers}
    want = [(0, "registration"), (3, "interval"), (9, "interval"), (15, "interval")]
    assert [(r.step, r.trigger) for r in mon.history] == want
    assert sends == [3, 9, 15]  # nothing travels on step 6 nor 12
    assert server_steps(daemon, mon.model_id) == [0, 3, 9, 15]
    at9 = mon.history[2]
    for l in mon.layers:
        assert rel(at9.per_layer_pr[l], pr_oracle(kept[l])) < 1e-5


def test_adaptive_delta_trigger(daemon, seed):
    torch.manual_seed(seed)
    model = models.LlamaForCausalLM()
    layers = [0, 1, 4, 5]
    mon = rvd.RVMonitor(model, early_layers=[0, 1], late_layers=[4, 5],
                        mode="training", measurement_interval=10, adaptive=True,
                        delta_threshold=0.05, address=daemon.grpc_address)
    direction = {}
    for l in range(6):
        d = torch.randn_like(model.model.layers[l].self_attn.v_proj.weight)
        direction[l] = d / d.norm()
    # Relative step sizes: 0.02 a step in one direction crosses 0.05 on the
    # third step after a measurement (0.06), far from the threshold; 0 is a
    # step without an update; 0.2 triggers at once.
    sizes = [None, 0.02, 0.02, 0.02, 0, 0.02, 0.2, 0, 0.02, 0.02, 0.02, 0.02,
             0.02, 0, 0, 0.02, 0.02, 0.02, 0.02, 0.02, 0.02]
    updates = [{l: models.llama_v(model, l) for l in layers}]
    for n in range(1, len(sizes)):
        if sizes[n]:
            perturb_(model, layers, direction, sizes[n])
        mon.step()
        updates.append({l: models.llama_v(model, l) for l in layers})
    expected = simulate(updates, 10, 0.05, layers)
    got = [(r.step, r.trigger, r.delta) for r in mon.history]
    assert [(s, t) for s, t, _ in got] == [(s, t) for s, t, _ in expected]
    for (_, _, d), (_, _, want) in zip(got, expected):
        assert (d is None) == (want is None) and (d is None or rel(d, want) < 1e-4)
    assert sum(t == "delta" for _, t, _ in got) >= 3 and any(t == "interval" for _, t, _ in got)
    assert server_steps(daemon, mon.model_id) == [s for s, _, _ in expected]
    for r in mon.history:  # each measured the weights of its own step
        for l in layers:
            assert rel(r.per_layer_pr[l], pr_oracle(updates[r.step][l])) < 1e-5


# ---- exports and summary ------------------------------------------------------

def test_exports_and_summary(daemon, tmp_path):
    model = models.LlamaForCausalLM()
    mon = rvd.RVMonitor(model, early_layers=[0, 1], late_layers=[4, 5],
                        mode="training", measurement_interval=2,
                        history_maxlen=3, address=daemon.grpc_address,
                        model_id="export-test")
    for n in range(1, 7):
        with torch.no_grad():
            model.model.layers[0].self_attn.v_proj.weight.mul_(1.0 + 0.1 * n)
        mon.step()
    assert [r.step for r in mon.history] == [2, 4, 6]  # maxlen 3 of 4 measurements
    last = mon.history[-1]
    assert mon.summary() == "\n".join([
        "RVMonitor",
        "  arch       : llama",
        "  mode       : training",
        "  layers     : [0, 1, 4, 5]",
        f"  rv (latest): {last.rv:.6f}",
        "  # measurements: 4",
        f"  last measured at step: 6, t={last.timestamp:.1f}"])

    mon.export_json(tmp_path / "h.json")
    doc = json.loads((tmp_path / "h.json").read_text())
    assert (doc["model_id"], doc["arch"], doc["mode"], doc["layers"],
            doc["measurements"]) == ("export-test", "llama", "training", [0, 1, 4, 5], 4)
    assert len(doc["history"]) == 3
    for d, r in zip(doc["history"], mon.history):
        assert (d["rv"], d["step"], d["timestamp"], d["elapsed_ms"], d["trigger"]) == \
            (r.rv, r.step, r.timestamp, r.elapsed_ms, r.trigger)
        assert d["per_layer_pr"] == {str(k): v for k, v in r.per_layer_pr.items()}

    mon.export_csv(tmp_path / "h.csv")
    rows = list(csv.DictReader(open(tmp_path / "h.csv")))
    assert list(rows[0]) == ["step", "timestamp", "rv", "elapsed_ms", "trigger",
                             "delta", "sequence", "pr_layer_0", "pr_layer_1",
                             "pr_layer_4", "pr_layer_5"]
    for row, r in zip(rows, mon.history):
        assert int(row["step"]) == r.step and float(row["rv"]) == r.rv
        assert row["delta"] == "" and int(row["sequence"]) == r.sequence
        assert all(float(row[f"pr_layer_{l}"]) == r.per_layer_pr[l] for l in mon.layers)

    empty = rvd.RVMonitor(model, address=f"127.0.0.1:{free_port()}", timeout=5)
    assert empty.summary().splitlines()[-3:] == [
        "  rv (latest): None", "  # measurements: 0", "  last measured: never"]


# ---- errors and a daemon that comes and goes ----------------------------------

def test_server_errors(daemon, caplog):
    model = models.LlamaForCausalLM()
    model.config.num_key_value_heads = 3  # 32 rows are not 3 kv heads of 16
    with pytest.raises(rvd.RvdError) as e:
        rvd.RVMonitor(model, address=daemon.grpc_address, on_error="raise")
    assert e.value.code_name == "INVALID_ARGUMENT"
    assert "model.layers.0.self_attn.v_proj.weight" in e.value.details
    with caplog.at_level(logging.WARNING, logger="rvd"):
        mon = rvd.RVMonitor(model, address=daemon.grpc_address, mode="training",
                            measurement_interval=1)
        assert mon.rv is None and mon.step() is None  # training goes on
    assert [s[2] for s in mon.skipped] == ["INVALID_ARGUMENT", "INVALID_ARGUMENT"]
    assert "INVALID_ARGUMENT" in caplog.text and "skipped" in caplog.text


def test_arguments_and_transport(daemon):
    model = models.LlamaForCausalLM()
    a = daemon.grpc_address
    with pytest.raises(ValueError, match="both early_layers and late_layers"):
        rvd.RVMonitor(model, early_layers=[0], address=a)
    with pytest.raises(ValueError, match=r"layers \[9\]"):
        rvd.RVMonitor(model, early_layers=[0], late_layers=[9], address=a)
    for bad in [dict(mode="train"), dict(measurement_interval=0),
                dict(on_error="ignore"), dict(transport="shm"),
                dict(delta_threshold=-1)]:
        with pytest.raises(ValueError):
            rvd.RVMonitor(model, address=a, **bad)
    with pytest.raises(rvd.TransportUnavailable, match="one CUDA device") as e:
        rvd.RVMonitor(model, address=a, transport="ipc")
    assert isinstance(e.value, NotImplementedError)
    assert rvd.RVMonitor(model, address=a, transport="auto").transport == "copy"
    assert rvd.RVMonitor(model, address=a, transport="copy").rv is not None


def test_daemon_down_at_start(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    model = models.LlamaForCausalLM()
    with pytest.raises(rvd.RvdError) as e:
        rvd.RVMonitor(model, address=address, on_error="raise", timeout=5)
    assert e.value.code_name == "UNAVAILABLE"
    mon = rvd.RVMonitor(model, address=address, timeout=5)  # inference, warn
    assert mon.rv is None and mon.step() is None
    d = start_daemon(tmp_path, grpc_address=address)
    try:
        assert mon.step() is not None  # the registration, retried
        assert [r.trigger for r in mon.history] == ["registration"]
        assert mon.step() == mon.rv and len(mon.history) == 1
    finally:
        d.stop()


def test_daemon_goes_away_and_comes_back(tmp_path, caplog):
    address = f"127.0.0.1:{free_port()}"
    d = start_daemon(tmp_path, grpc_address=address)
    model = models.LlamaForCausalLM()
    mon = rvd.RVMonitor(model, early_layers=[0], late_layers=[5], mode="training",
                        measurement_interval=2, adaptive=True,
                        delta_threshold=0.5, address=address, timeout=5)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def train_step():
        opt.zero_grad()
        model(torch.randn(4, 64)).mean().backward()
        opt.step()
        return mon.step()

    with caplog.at_level(logging.INFO, logger="rvd"):
        train_step(), train_step()
        d.stop()
        for _ in range(4):  # steps 3..6: 4 and 6 are due, rvd is gone
            train_step()
        d = start_daemon(tmp_path, grpc_address=address)  # a new rvd on the same port
        try:
            for _ in range(2):  # steps 7, 8: 8 is due
                train_step()
            assert [r.step for r in mon.history] == [0, 2, 8]
            assert [(s, c) for s, _, c in mon.skipped] == [(4, "UNAVAILABLE"), (6, "UNAVAILABLE")]
            # The restarted rvd has step 8 and none of the skipped ones (and
            # the earlier ones only if it keeps history across restarts).
            assert server_steps(d, mon.model_id) in ([8], [0, 2, 8])
            assert rel(mon.history[-1].per_layer_pr[5],
                       pr_oracle(models.llama_v(model, 5))) < 1e-5
        finally:
            d.stop()
    assert "UNAVAILABLE" in caplog.text and "answers again" in caplog.text
    # on_error="raise": the same outage raises out of step().
    mon.on_error = "raise"
    train_step()
    with pytest.raises(rvd.RvdError, match="UNAVAILABLE"):
        train_step()


def test_expired_deadline_pauses_measuring(monkeypatch):
    model = models.LlamaForCausalLM()
    mon = rvd.RVMonitor(model, address=f"127.0.0.1:{free_port()}", mode="training",
                        measurement_interval=1, timeout=5)
    calls = []

    def slow(*a, **k):
        calls.append(mon.steps)
        raise rvd.RvdError(grpc.StatusCode.DEADLINE_EXCEEDED, "slow")

    mon.client.measure_encoded = slow
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(2, 64)).mean().backward()
        opt.step()
        mon.step()
    assert calls == [1]  # steps 2 and 3 fall in the pause
    assert [c for _, _, c in mon.skipped] == ["UNAVAILABLE", "DEADLINE_EXCEEDED",
                                             "PAUSED", "PAUSED"]


def test_prometheus_gauges(daemon, monkeypatch):
    sets = {}

    class Gauge:
        def __init__(self, name, doc, labels):
            self.name = name
            fake.REGISTRY._names_to_collectors[name] = self

        def labels(self, *values):
            return types.SimpleNamespace(
                set=lambda v: sets.__setitem__((self.name,) + values, v))

    fake = types.SimpleNamespace(Gauge=Gauge, REGISTRY=types.SimpleNamespace(
        _names_to_collectors={}))
    monkeypatch.setitem(sys.modules, "prometheus_client", fake)
    mon = rvd.RVMonitor(models.LlamaForCausalLM(), address=daemon.grpc_address,
                        prometheus=True, model_id="prom")
    assert sets[("rv_cuda_rv", "prom")] == mon.rv
    assert sets[("rv_cuda_pr_layer", "prom", "3")] == mon.history[0].per_layer_pr[3]
