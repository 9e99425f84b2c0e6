"""RVMonitor's ipc transport against the real rvd with its CUDA module
(ctest python_client_gpu, label gpu; skipped where torch sees no GPU).

A llama-shaped model (tests/python/models.py, GQA) trains with AdamW on the
GPU; the monitor shares its V weights with rvd through CUDA IPC and notifies
every step. After each update the test keeps a copy of the V weights
(ordered on the trainer's stream: exactly that step's weights), and every
measurement rvd records is checked against the float64 Gram of the copy at
its step (<= 1e-5 relative: every layer's PR, every kv head's, R_V; the
oracle itself against float64 svdvals); the
history against rvd's trigger policy step for step (live_check.py). Then:
a trainer that writes its weights right after notifying still gets exact
measurements, and the same trainer without the pre-step wait on rvd's event
is caught by the same check; expandable segments ('e' handles) work or fail
with a clear error; auto picks ipc on the CUDA rvd and copy on a CPU one; an
rvd killed mid-training neither stops nor hangs the trainer, which registers
again with the next rvd.
"""
import faulthandler
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
import torch

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]
for p in (ROOT / "client" / "python", ROOT / "tests" / "integration", HERE.parent, HERE):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import models  # noqa: E402
import rvd  # noqa: E402
from live_check import LiveChecker, PolicyOracle, pr64, rel  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

LAYERS, HEADS, KV, HIDDEN = 8, 8, 4, 512
HEAD_DIM = HIDDEN // HEADS
EARLY, LATE = [0, 1], [6, 7]


@pytest.fixture(scope="module")
def cuda_rvd(tmp_path_factory):
    from daemons import start_daemon
    d = start_daemon(tmp_path_factory.mktemp("rvd"), backend="cuda")
    yield d
    d.stop()


def make_model(dtype, seed=0):
    torch.manual_seed(seed)
    return models.LlamaForCausalLM(layers=LAYERS, heads=HEADS, kv_heads=KV,
                                   hidden=HIDDEN, dtype=dtype, seed=seed).cuda()


def v_weights(model):
    return {l: model.model.layers[l].self_attn.v_proj.weight for l in EARLY + LATE}


def train(model, mon, opt, steps, lr_of, write_after_notify=False, policy=None,
          busy_cycles=0, last_measured=None):
    """Trains `steps` steps; returns (checker, decisions): decisions are
    (step, expected, borderline, measured, delta) when a PolicyOracle is
    given. last_measured: the step whose measurement ends the run (else a
    short wait for any still coming)."""
    checker = LiveChecker(mon, lambda: v_weights(model), HEAD_DIM, EARLY, LATE)
    checker.checked = len(mon.history)  # earlier runs' entries are not ours
    w0 = next(model.parameters())
    x = torch.randn(16, HIDDEN, device=w0.device, dtype=w0.dtype)
    decisions = []
    for i in range(1, steps + 1):
        n = mon.steps + 1  # the step this iteration notifies
        for g in opt.param_groups:
            g["lr"] = lr_of(i)
        opt.zero_grad()
        model(x).float().pow(2).mean().backward()
        if busy_cycles:
            torch.cuda._sleep(busy_cycles)  # the update, and so our event, comes late
        opt.step()
        checker.keep(n)
        expected, delta, border = (policy.decide(n, checker.kept[n]) if policy
                                   else (True, None, False))
        mon.step()
        if write_after_notify:
            opt.step()  # writes the weights at once: the pre-step hook orders it
        if policy is not None:
            got = checker.wait_for_step(n, 5.0 if expected or border else 0.05)
            assert mon._link.answers.get(n, (None, ""))[1] != "busy", \
                f"rvd answered busy at step {n} (its measurements fell behind)"
            if got:
                policy.measured(n, checker.kept[n])
            decisions.append((n, expected, border, got, delta))
        checker.check()
    if last_measured is not None:  # relative to this run's first step
        last = mon.steps - steps + last_measured
        assert checker.wait_for_step(last, 10.0), f"no measurement of step {last}"
    else:
        time.sleep(0.3)
    checker.check()
    return checker, decisions


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_ipc_training_exact_and_policy(cuda_rvd, dtype):
    model = make_model(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    interval, threshold = 5, 0.08
    mon = rvd.RVMonitor(model, early_layers=EARLY, late_layers=LATE, mode="training",
                        measurement_interval=interval, adaptive=True,
                        delta_threshold=threshold, per_head=True, transport="ipc",
                        on_error="raise", address=cuda_rvd.grpc_address, optimizer=opt)
    try:
        assert mon.transport == "ipc"
        policy = PolicyOracle(interval, True, threshold)
        # small steps first (the interval triggers), then large ones (the delta)
        checker, decisions = train(model, mon, opt, 24,
                                   lambda n: 1e-6 if n <= 12 else 1e-3, policy=policy)
        print("decisions (step, expected, borderline, measured, delta):", decisions)
        assert not checker.failures, checker.failures[:10]
        assert checker.worst <= 1e-5
        wrong = [d for d in decisions if d[1] != d[3] and not d[2]]
        assert not wrong, wrong
        measured = [d[0] for d in decisions if d[3]]
        assert [r.step for r in mon.history] == measured
        triggers = {r.trigger for r in mon.history}
        assert {"first", "interval", "delta"} <= triggers, triggers
        served = rvd.Client(cuda_rvd.grpc_address).history(mon.model_id)
        assert [m.step for m in served] == measured
        assert {m.backend for m in served} == {"cuda"}
        assert checker.oracle_vs_svd is not None and checker.oracle_vs_svd < 1e-10
        lat = sorted(r.latency_ms for r in mon.history if r.latency_ms is not None)
        print(f"{dtype}: {len(mon.history)} measurements, worst rel error "
              f"{checker.worst:.2e}, notify -> recorded p50 {lat[len(lat) // 2]:.3f} ms")
    finally:
        mon.close()


def write_after_notify_run(d, break_order):
    model = make_model(torch.bfloat16, seed=1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    mon = rvd.RVMonitor(model, early_layers=EARLY, late_layers=LATE, mode="training",
                        measurement_interval=1, per_head=True, transport="ipc",
                        on_error="raise", address=d.grpc_address, optimizer=opt)
    try:
        if break_order:
            mon._hooks[0].remove()  # the pre-step hook: no wait on rvd's event
        checker, _ = train(model, mon, opt, 20, lambda n: 3e-3,
                           write_after_notify=True, busy_cycles=2_000_000,
                           last_measured=20)
        return checker, [r.step for r in mon.history]
    finally:
        mon.close()


def test_write_right_after_notify_is_consistent(cuda_rvd):
    checker, steps = write_after_notify_run(cuda_rvd, break_order=False)
    assert steps == list(range(1, 21))
    assert not checker.failures, checker.failures[:10]
    print(f"consistent: worst rel error {checker.worst:.2e}")


def test_broken_ordering_is_caught(cuda_rvd):
    """The mutant of the test above: the same check must fail."""
    checker, steps = write_after_notify_run(cuda_rvd, break_order=True)
    print(f"broken ordering: {len(checker.failures)} mismatches in {len(steps)} "
          f"measurements; first: {checker.failures[:3]}")
    assert checker.failures, "the snapshot never saw the write after the notification"


def test_auto_uses_ipc_on_the_cuda_rvd_and_copy_on_a_cpu_one(cuda_rvd, tmp_path, caplog):
    from daemons import start_daemon
    model = make_model(torch.bfloat16)
    mon = rvd.RVMonitor(model, address=cuda_rvd.grpc_address, transport="auto")
    assert mon.transport == "ipc" and mon.rv is not None  # inference: measured at registration
    r = mon.history[0]
    assert rel(r.per_layer_pr[6], pr64(v_weights(model)[6])) < 1e-5
    mon.close()
    cpu = start_daemon(tmp_path, backend="cpu")
    try:
        mon = rvd.RVMonitor(model, address=cpu.grpc_address, transport="auto")
        assert mon.transport == "copy" and mon.rv is not None
        assert "does not take live weights" in caplog.text
        with pytest.raises(rvd.TransportUnavailable, match="FAILED_PRECONDITION"):
            rvd.RVMonitor(model, address=cpu.grpc_address, transport="ipc")
    finally:
        cpu.stop()


def test_expandable_segments(cuda_rvd):
    """'e' handles (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), in a
    process of their own: exact measurements, or an error that names what
    is missing (the descriptors' pidfd_getfd: same user or CAP_SYS_PTRACE)."""
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    r = subprocess.run([sys.executable, __file__, "--expandable", cuda_rvd.grpc_address],
                       capture_output=True, text=True, timeout=180, env=env)
    print(r.stdout[-3000:], r.stderr[-3000:])
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["handle_type"] == "e"
    if "error" in out:
        assert any(w in out["error"].lower() for w in ("pidfd", "ptrace", "expandable")), out
    else:
        assert out["measurements"] >= 5 and not out["failures"], out


def test_rvd_killed_mid_training(tmp_path):
    """(Last in the file: its watchdog ends the whole run.) SIGKILL of rvd: the trainer neither stops nor hangs (a watchdog
    dumps the stacks and exits after 120 s), and registers again with the
    next rvd on the same address, whose measurements are exact."""
    from daemons import start_daemon
    from rvdtest import free_port
    faulthandler.dump_traceback_later(120, exit=True)
    address = f"127.0.0.1:{free_port()}"
    d = start_daemon(tmp_path / "a", backend="cuda", grpc_address=address)
    model = make_model(torch.bfloat16, seed=2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    mon = rvd.RVMonitor(model, early_layers=EARLY, late_layers=LATE, mode="training",
                        measurement_interval=2, transport="ipc", address=address,
                        optimizer=opt, timeout=5, per_head=True)
    try:
        train(model, mon, opt, 6, lambda n: 1e-4)
        d.stop(sig=signal.SIGKILL)
        train(model, mon, opt, 4, lambda n: 1e-4)  # rvd gone: warnings, no hang
        torch.cuda.synchronize()
        d = start_daemon(tmp_path / "b", backend="cuda", grpc_address=address)
        # the monitor's channel out of its reconnect backoff, and its pause over
        import grpc
        grpc.channel_ready_future(mon.client._channel).result(timeout=10)
        mon._paused_until = 0.0
        checker, _ = train(model, mon, opt, 8, lambda n: 1e-4)
        checker.check()
        assert mon._link.registered and mon._link.registrations >= 2
        assert not checker.failures, checker.failures[:10]
        served = rvd.Client(address).history(mon.model_id)
        assert served, "the new rvd measured nothing"
    finally:
        mon.close()
        d.stop()
        faulthandler.cancel_dump_traceback_later()


def _expandable_child(address):
    model = make_model(torch.bfloat16, seed=3)
    from rvd import ipc
    scratch = torch.empty(1 << 20, device="cuda")  # the allocator's kind of handle
    kind = ipc.parse_torch_handle(ipc.share_tensor(scratch)[1]).type
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    try:
        mon = rvd.RVMonitor(model, early_layers=EARLY, late_layers=LATE,
                            mode="training", measurement_interval=1, per_head=True,
                            transport="ipc", on_error="raise", address=address,
                            optimizer=opt)
    except (rvd.TransportUnavailable, rvd.RvdError) as e:
        print(json.dumps({"handle_type": kind, "error": str(e)}))
        return
    try:
        checker, _ = train(model, mon, opt, 6, lambda n: 1e-4, last_measured=6)
        print(json.dumps({"handle_type": kind, "measurements": len(mon.history),
                          "failures": [str(f) for f in checker.failures[:5]],
                          "worst": checker.worst}))
    finally:
        mon.close()


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--expandable":
    _expandable_child(sys.argv[2])
