#!/usr/bin/env python3
"""Issue 15 sections 6 and 7 on the H200: a real training loop with RVMonitor
over CUDA IPC (a benchmark and a proof, not a timed test).

    python3 bench/live_train.py --rvd STAGE/bin/rvd [--out DIR]

STAGE is a build staged by scripts/gpu_stage.sh (rvd, lib/librvd_cuda.so,
python/ stubs, gpu-libs/); the script starts rvd itself (backend cuda, on
free loopback ports, LD_LIBRARY_PATH with STAGE/gpu-libs) and stops it. For
each parameter dtype, bf16 parameters and fp32 parameters under bf16
autocast, a transformers LlamaForCausalLM built from a config (GQA: 32
layers, hidden 4096, 32 heads, 8 kv heads: V 1024x4096 per layer, a 7B
model's V set; random init, a narrow MLP and vocabulary so that fp32 with
AdamW fits), AdamW, synthetic tokens:

 check     --steps (300) steps, RVMonitor in training mode over IPC with
           interval --interval (50) and the adaptive trigger (--threshold;
           the learning rate is 1e-6 for the first half, --lr after, so both
           triggers fire); after each update the V weights are copied (on
           the trainer's stream: exactly that step's), every recorded
           measurement is compared with the float64 Gram of the copy at
           its step (R_V, every layer's PR, every kv head's PR; <= 1e-5
           relative; the oracle itself against float64 svdvals once), and
           the history with rvd's trigger policy step for step
           (tests/python/gpu/live_check.py). Untimed.
 consistency  interval 1, the optimizer stepping again right after each
           notification: every measurement exact; then the same with the
           pre-step wait on rvd's event removed, which must be caught.
 latency   the GPU idle, interval 1: notification -> measurement recorded
           (rvd's timestamp minus the notification's wall time, and the
           arrival here), per layer and per head, --latency-n notifications
           20 ms apart.
 overhead  attached vs detached interleaved blocks (--blocks pairs of
           --block-steps steps, A-B then B-A), interval 50 and every step,
           IPC and the copy transport; the CPU time inside monitor.step()
           (wall and thread CPU time) on measuring steps.
Writes DIR/live_train.json and DIR/live_train.md (DIR: --out, else $OUT,
else ./live-train-out) with every number beside issue 15's goals, and exits
non-zero when a check failed.

--smoke-cpu runs the same code on this machine's CPU against an in-process
fake rvd that reads the weights (tests/python/fake_live.py), with the
small llama of tests/python/models.py when transformers is missing: to
check the script, not to measure.
"""
import argparse
import contextlib
import json
import os
import pathlib
import statistics
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
for p in (ROOT / "client" / "python", ROOT / "tests" / "integration",
          ROOT / "tests" / "python", ROOT / "tests" / "python" / "gpu"):
    sys.path.insert(0, str(p))

import torch  # noqa: E402

GOALS = {
    "cpu_in_step_ms_p50": 0.5,
    "latency_bf16_ms_p50": 1.0,
    "latency_f32_ms_p50": 1.5,
    "overhead_interval50": 0.001,
    "overhead_every_step": 0.01,
}


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return None
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def build_model(args, dtype, device):
    """LlamaForCausalLM from a config, random init, on the device."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        if not args.smoke_cpu:
            raise
        import models
        m = models.LlamaForCausalLM(layers=args.layers, heads=args.heads,
                                    kv_heads=args.kv_heads, hidden=args.hidden,
                                    spectrum=False).to(dtype)
        m.toy = True
        return m.to(device)
    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                      intermediate_size=args.ffn, num_hidden_layers=args.layers,
                      num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                      max_position_embeddings=args.seq, tie_word_embeddings=False)
    torch.manual_seed(args.seed)
    with torch.device(device):
        m = LlamaForCausalLM(cfg)
    m = m.to(dtype)
    m.toy = False
    return m


class Trainer:
    """One model, its AdamW and a synthetic batch; step() is one training
    step (fp32 parameters: forward under bf16 autocast)."""

    def __init__(self, args, param_dtype, device):
        self.model = build_model(args, param_dtype, device)
        self.device = device
        self.autocast = param_dtype == torch.float32 and device.type == "cuda"
        if args.smoke_cpu:  # torch 1.13 here: an AdamW with torch 2's step hooks
            import fake_live
            self.opt = fake_live.HookedAdamW(self.model.parameters(), fake_live.Log(),
                                             lr=args.lr)
        else:
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=args.lr)
        g = torch.Generator(device="cpu").manual_seed(args.seed)
        if self.model.toy:
            self.x = torch.randn(args.batch, args.hidden, generator=g).to(device, param_dtype)
        else:
            self.ids = torch.randint(0, args.vocab, (args.batch, args.seq),
                                     generator=g).to(device)

    def v(self, layers=None):
        out = {}
        for l, layer in enumerate(self.model.model.layers):
            if layers is None or l in layers:
                out[l] = layer.self_attn.v_proj.weight
        return out

    def loss(self):
        if self.model.toy:
            return self.model(self.x).float().square().mean()
        ctx = torch.autocast("cuda", dtype=torch.bfloat16) if self.autocast \
            else contextlib.nullcontext()
        with ctx:
            return self.model(input_ids=self.ids, labels=self.ids).loss

    def step(self, lr=None):
        if lr is not None:
            for group in self.opt.param_groups:
                group["lr"] = lr
        self.opt.zero_grad(set_to_none=True)
        self.loss().backward()
        self.opt.step()


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def monitor(rvd, trainer, address, **kw):
    n = len(trainer.model.model.layers)
    q = max(1, n // 4)
    return rvd.RVMonitor(trainer.model, early_layers=range(q),
                         late_layers=range(n - q, n), mode="training",
                         on_error="raise", address=address, **kw)


# ---- check: exactness and the policy ------------------------------------------------

def run_check(rvd, args, trainer, address, label):
    from live_check import LiveChecker, PolicyOracle
    mon = monitor(rvd, trainer, address, measurement_interval=args.interval,
                  adaptive=True, delta_threshold=args.threshold, per_head=True,
                  transport="ipc", optimizer=trainer.opt)
    layers = mon.layers
    head_dim = args.hidden // args.heads
    checker = LiveChecker(mon, lambda: trainer.v(set(layers)), head_dim,
                          mon.early_layers, mon.late_layers)
    policy = PolicyOracle(args.interval, True, args.threshold)
    decisions = []
    t0 = time.time()
    for n in range(1, args.steps + 1):
        trainer.step(1e-6 if n <= args.steps // 2 else args.lr)
        checker.keep(n)
        expected, delta, border = policy.decide(n, checker.kept[n])
        mon.step()
        got = checker.wait_for_step(n, 5.0 if expected or border else 0.03)
        # rvd's one exception to the policy: every snapshot buffer in use
        busy = mon._link.answers.get(n, (None, ""))[1] == "busy"
        border = border or busy
        if got:
            policy.measured(n, checker.kept[n])
        elif not border:
            checker.kept.pop(n, None)  # none can come for it: free the copy
        decisions.append({"step": n, "expected": expected, "borderline": border,
                          "measured": got, "delta": delta, "busy": busy})
        checker.check()
    time.sleep(0.5)
    checker.check()
    history = mon.history
    wrong = [d for d in decisions if d["expected"] != d["measured"] and not d["borderline"]]
    measured = [d["step"] for d in decisions if d["measured"]]
    served = [m.step for m in rvd.Client(address).history(mon.model_id)]
    triggers = {}
    for r in history:
        triggers[r.trigger] = triggers.get(r.trigger, 0) + 1
    mon.close()
    out = {
        "label": label, "steps": args.steps, "interval": args.interval,
        "threshold": args.threshold, "measurements": len(history),
        "triggers": triggers, "worst_rel_error": checker.worst,
        "exact": not checker.failures and checker.worst <= 1e-5,
        "oracle_vs_svd": checker.oracle_vs_svd,
        "failures": [list(map(str, f)) for f in checker.failures[:10]],
        "policy_ok": not wrong and [r.step for r in history] == measured
        and served == measured,
        "policy_mismatches": wrong[:10],
        "borderline": [d["step"] for d in decisions if d["borderline"]],
        "busy": [d["step"] for d in decisions if d["busy"]],
        "history_steps": [r.step for r in history], "served_steps": served,
        "seconds": time.time() - t0,
    }
    print(f"[{label}] check: {out['measurements']} measurements {triggers}, worst "
          f"rel error {checker.worst:.2e}, exact {out['exact']}, policy {out['policy_ok']}")
    return out


# ---- consistency: the trainer writes right after notifying --------------------------

def run_consistency(rvd, args, trainer, address, label, broken):
    """Interval 1; right after each notification the trainer writes every
    monitored V weight in place (one foreach kernel adding a fixed random
    bump, which changes the PRs), after wait_for_snapshot() as a trainer
    that writes weights outside its optimizer must: the snapshot must still
    be the notified step's. broken: that wait and the optimizer's pre-step
    hook removed, so the write races rvd's copy, which the same check must
    catch. (An optimizer step as the writer would not do: AdamW reaches the
    parameters only after its passes over the moments, milliseconds after
    the copy has finished, so the race would never show.)"""
    from live_check import LiveChecker
    mon = monitor(rvd, trainer, address, measurement_interval=1, per_head=True,
                  transport="ipc", optimizer=trainer.opt)
    if broken:
        mon._hooks[0].remove()
    layers = set(mon.layers)
    checker = LiveChecker(mon, lambda: trainer.v(layers), args.hidden // args.heads,
                          mon.early_layers, mon.late_layers)
    vs = list(trainer.v(layers).values())
    g = torch.Generator(device=vs[0].device).manual_seed(args.seed + 1)
    bumps = [torch.randn(v.shape, generator=g, device=v.device).mul_(
        0.05 * v.float().std().item()).to(v.dtype) for v in vs]
    for _ in range(args.consistency_steps):
        n = mon.steps + 1
        trainer.step(args.lr)
        checker.keep(n)
        mon.step()
        if not broken:
            mon.wait_for_snapshot()
        with torch.no_grad():
            torch._foreach_add_(vs, bumps)  # writes the weights at once
        checker.check()
    checker.wait_for_step(mon.steps, 10.0)
    time.sleep(0.2)
    checker.check()
    mon.close()
    out = {"label": label, "broken": broken, "steps": args.consistency_steps,
           "measurements": checker.checked, "mismatches": len(checker.failures),
           "worst_rel_error": checker.worst,
           "first_mismatches": [list(map(str, f)) for f in checker.failures[:3]]}
    out["ok"] = (out["mismatches"] > 0) if broken else \
        (out["mismatches"] == 0 and out["measurements"] == args.consistency_steps)
    print(f"[{label}] consistency broken={broken}: {out['measurements']} measurements, "
          f"{out['mismatches']} mismatches, worst {checker.worst:.2e}: "
          f"{'as expected' if out['ok'] else 'NOT as expected'}")
    return out


# ---- latency, idle GPU ------------------------------------------------------------

def run_latency(rvd, args, trainer, address, label, per_head):
    mon = monitor(rvd, trainer, address, measurement_interval=1, per_head=per_head,
                  transport="ipc")
    lat, inside, arrive, cpu = [], [], [], []
    for i in range(args.latency_n + 3):
        sync(trainer.device)
        time.sleep(0.02)
        n = len(mon.history)
        t0 = time.perf_counter()
        mon.step()
        cpu.append(time.perf_counter() - t0)
        deadline = time.monotonic() + 5
        while len(mon.history) == n and time.monotonic() < deadline:
            time.sleep(0.0002)
        if i >= 3 and len(mon.history) > n:  # the first few warm up
            r = mon.history[-1]
            lat.append(r.latency_ms)
            if r.rvd_ms is not None:  # an rvd without Measurement.notified: none
                inside.append(r.rvd_ms)
            arrive.append(r.elapsed_ms)
    mon.close()
    out = {"label": label, "per_head": per_head, "n": len(lat),
           "recorded_ms_p50": pct(lat, 0.5), "recorded_ms_p90": pct(lat, 0.9),
           "arrived_ms_p50": pct(arrive, 0.5), "arrived_ms_p90": pct(arrive, 0.9),
           "step_call_ms_p50": 1e3 * pct(cpu, 0.5),
           # rvd's share: its receipt of the notification -> recorded; the
           # rest of recorded_ms is the notification's trip to rvd.
           "in_rvd_ms_p50": pct(inside, 0.5) if inside else None}
    in_rvd = f"{out['in_rvd_ms_p50']:.3f} ms" if inside else "not reported"
    print(f"[{label}] latency per_head={per_head}: recorded p50 "
          f"{out['recorded_ms_p50']:.3f} ms (p90 {out['recorded_ms_p90']:.3f}), "
          f"of it in rvd p50 {in_rvd}, arrived p50 {out['arrived_ms_p50']:.3f} ms")
    return out


# ---- overhead: attached vs detached blocks ------------------------------------------

def run_overhead(rvd, args, trainer, address, label, transport, interval):
    mon = monitor(rvd, trainer, address, measurement_interval=interval,
                  transport=transport, optimizer=trainer.opt)
    assert mon.transport == transport, (mon.transport, transport)
    mon.set_optimizer(None)
    for _ in range(2):
        trainer.step(args.lr)
    sync(trainer.device)
    blocks = {"attached": [], "detached": []}
    pairs, wall, cpu = [], {"measuring": [], "other": []}, {"measuring": [], "other": []}
    for b in range(args.blocks):
        order = ("detached", "attached") if b % 2 == 0 else ("attached", "detached")
        per = {}
        for arm in order:
            attached = arm == "attached"
            mon.set_optimizer(trainer.opt if attached else None)
            trainer.step(args.lr)  # the block's first step: warm-up, untimed
            if attached:
                mon.step()
            sync(trainer.device)
            t0 = time.perf_counter()
            for _ in range(args.block_steps):
                trainer.step(args.lr)
                if attached:
                    due = (mon.steps + 1) % interval == 0 if transport == "copy" \
                        else interval == 1
                    c0, w0 = time.thread_time(), time.perf_counter()
                    mon.step()
                    kind = "measuring" if due else "other"
                    wall[kind].append(time.perf_counter() - w0)
                    cpu[kind].append(time.thread_time() - c0)
            sync(trainer.device)
            per[arm] = (time.perf_counter() - t0) / args.block_steps
            blocks[arm].append(per[arm])
        pairs.append(per["attached"] / per["detached"] - 1)
        mon.set_optimizer(None)
    mon.close()
    out = {"label": label, "transport": transport, "interval": interval,
           "step_ms_detached": 1e3 * statistics.median(blocks["detached"]),
           "step_ms_attached": 1e3 * statistics.median(blocks["attached"]),
           "overhead": statistics.median(pairs), "overhead_min": min(pairs),
           "overhead_max": max(pairs), "pairs": pairs,
           "monitor_step_wall_ms_p50": {k: 1e3 * pct(v, 0.5) if v else None
                                        for k, v in wall.items()},
           "monitor_step_cpu_ms_p50": {k: 1e3 * pct(v, 0.5) if v else None
                                       for k, v in cpu.items()},
           "measurements": len(mon.history)}
    print(f"[{label}] {transport} interval {interval}: {out['step_ms_detached']:.2f} ms "
          f"detached, {out['step_ms_attached']:.2f} ms attached, overhead "
          f"{100 * out['overhead']:+.3f}% (pairs {100 * out['overhead_min']:+.3f}% .. "
          f"{100 * out['overhead_max']:+.3f}%), monitor.step() wall p50 "
          f"{out['monitor_step_wall_ms_p50']}")
    return out


# ---- the report ----------------------------------------------------------------------

def verdicts(result):
    rows = []

    def row(what, value, goal, ok, unit="ms"):
        rows.append({"what": what, "value": value, "goal": goal, "met": ok, "unit": unit})

    for o in result["overhead"]:
        if o["transport"] == "ipc" and o["interval"] == 1 and o["label"] == "bf16":
            v = o["monitor_step_wall_ms_p50"]["measuring"]
            row("CPU time inside monitor.step() on a measuring step (IPC, bf16), p50",
                v, GOALS["cpu_in_step_ms_p50"], v is not None and v <= GOALS["cpu_in_step_ms_p50"])
    for lat in result["latency"]:
        key = "latency_bf16_ms_p50" if lat["label"] == "bf16" else "latency_f32_ms_p50"
        v = lat["recorded_ms_p50"]
        row(f"notification -> recorded, {lat['label']}, "
            f"{'per head' if lat['per_head'] else 'per layer'}, p50", v, GOALS[key],
            v is not None and v <= GOALS[key])
    for o in result["overhead"]:
        if o["transport"] != "ipc":
            continue
        key = "overhead_interval50" if o["interval"] == 50 else "overhead_every_step"
        g = GOALS[key] if o["interval"] in (1, 50) else None
        row(f"training step overhead, IPC, interval {o['interval']}, {o['label']}",
            o["overhead"], g, g is not None and o["overhead"] < g, "fraction")
    return rows


def markdown(result):
    lines = ["# bench/live_train.py", "", f"Command: `{result['command']}`", "",
             f"Model: {result.get('model')}", ""]
    if "error" in result:
        lines += ["The run stopped with an error:", "", "```", result["error"], "```", ""]
    lines += ["## Goals (issue 15 section 6)", "",
             "| what | value | goal | met |", "|---|---|---|---|"]
    for r in result["verdicts"]:
        if r["unit"] == "fraction":
            value = f"{100 * r['value']:+.3f}%"
            goal = f"< {100 * r['goal']:.1f}%"
        else:
            value = "n/a" if r["value"] is None else f"{r['value']:.3f} ms"
            goal = f"<= {r['goal']} ms"
        lines.append(f"| {r['what']} | {value} | {goal} | {'yes' if r['met'] else 'NO'} |")
    lines += ["", "## Overhead blocks (attached vs detached, interleaved)", "",
              "| params | transport | interval | step detached ms | attached ms | "
              "overhead (median of pairs) | pairs min .. max | monitor.step() wall p50 "
              "measuring / other ms | CPU p50 measuring / other ms |",
              "|---|---|---|---|---|---|---|---|---|"]

    def ms(x):
        return "n/a" if x is None else f"{x:.3f}"
    for o in result["overhead"]:
        w, c = o["monitor_step_wall_ms_p50"], o["monitor_step_cpu_ms_p50"]
        lines.append(
            f"| {o['label']} | {o['transport']} | {o['interval']} | "
            f"{o['step_ms_detached']:.2f} | {o['step_ms_attached']:.2f} | "
            f"{100 * o['overhead']:+.3f}% | {100 * o['overhead_min']:+.3f}% .. "
            f"{100 * o['overhead_max']:+.3f}% | {ms(w['measuring'])} / {ms(w['other'])} | "
            f"{ms(c['measuring'])} / {ms(c['other'])} |")
    lines += ["", "## Latency, idle GPU (notification -> measurement)", "",
              "| params | per head | n | recorded p50 / p90 ms | arrived here p50 / p90 ms | "
              "monitor.step() p50 ms |", "|---|---|---|---|---|---|"]
    for lat in result["latency"]:
        lines.append(f"| {lat['label']} | {lat['per_head']} | {lat['n']} | "
                     f"{ms(lat['recorded_ms_p50'])} / {ms(lat['recorded_ms_p90'])} | "
                     f"{ms(lat['arrived_ms_p50'])} / {ms(lat['arrived_ms_p90'])} | "
                     f"{ms(lat['step_call_ms_p50'])} |")
    lines += ["", "## Proof (issue 15 section 7)", "",
              "| params | steps | measurements (triggers) | worst rel. error | exact "
              "(<= 1e-5) | policy step for step | borderline steps |",
              "|---|---|---|---|---|---|---|"]
    for c in result["check"]:
        lines.append(f"| {c['label']} | {c['steps']} | {c['measurements']} "
                     f"{c['triggers']} | {c['worst_rel_error']:.2e} | "
                     f"{'yes' if c['exact'] else 'NO'} | {'yes' if c['policy_ok'] else 'NO'}"
                     f" | {c['borderline']} |")
    lines += ["", "## Consistency: the trainer writes right after notifying (interval 1)", "",
              "| params | pre-step wait | measurements | mismatches | worst rel. error | "
              "as expected |", "|---|---|---|---|---|---|"]
    for c in result["consistency"]:
        lines.append(f"| {c['label']} | {'removed' if c['broken'] else 'kept'} | "
                     f"{c['measurements']} | {c['mismatches']} | "
                     f"{c['worst_rel_error']:.2e} | {'yes' if c['ok'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def start_rvd(args):
    """(address, stop) of the rvd to use."""
    if args.smoke_cpu:
        import fake_live
        import pytest
        fake = fake_live.FakeRvd(real=True)
        server, address = fake_live.serve(fake)
        mp = pytest.MonkeyPatch()
        fake_live.install(mp, fake.log)

        def stop():
            server.stop(0)
            mp.undo()
        return address, stop
    rvd_bin = pathlib.Path(args.rvd).resolve()
    build = rvd_bin.parent.parent
    os.environ["RVD_BUILD_DIR"] = str(build)
    libs = build / "gpu-libs"
    if libs.is_dir() and str(libs) not in os.environ.get("LD_LIBRARY_PATH", ""):
        os.environ["LD_LIBRARY_PATH"] = f"{libs}:{os.environ.get('LD_LIBRARY_PATH', '')}"
    import rvdtest
    rvdtest.RVD = rvd_bin
    from daemons import start_daemon
    tmp = pathlib.Path(args.out) / "rvd"
    tmp.mkdir(parents=True, exist_ok=True)
    # room for three snapshots of an f32 7B V set (512 MiB each) beside the
    # engine's own buffers; the trainer uses under 50 GB of the H200's 141
    d = start_daemon(tmp, backend="cuda", compute_workers=4,
                     cuda_max_device_bytes=16 << 30, log_level=args.rvd_log_level)

    def stop():
        code = d.stop()
        (pathlib.Path(args.out) / "rvd.log").write_text(d.log_path.read_text())
        return code
    return d.grpc_address, stop


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rvd", default=str(pathlib.Path(os.environ.get(
        "RVD_BUILD_DIR", "build")) / "bin" / "rvd"), help="rvd binary (of a staged build)")
    ap.add_argument("--out", default=os.environ.get("OUT", "live-train-out"))
    ap.add_argument("--dtypes", default="bf16,f32")
    ap.add_argument("--phases", default="check,consistency,latency,overhead")
    ap.add_argument("--consistency-steps", type=int, default=20)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--interval", type=int, default=50)
    ap.add_argument("--threshold", type=float, default=0.02)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--latency-n", type=int, default=50)
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--block-steps", type=int, default=20)
    ap.add_argument("--copy-block-steps", type=int, default=6,
                    help="steps per block for the copy transport every step")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rvd-log-level", default="info",
                    help="debug: each live measurement's timeline in rvd.log")
    ap.add_argument("--smoke-cpu", action="store_true")
    args = ap.parse_args()
    pathlib.Path(args.out).mkdir(parents=True, exist_ok=True)
    device = torch.device("cpu" if args.smoke_cpu else "cuda")
    phases = set(args.phases.split(","))
    print(f"seed={args.seed}")
    address, stop = start_rvd(args)
    import rvd
    result = {"command": " ".join(["python3"] + sys.argv), "check": [], "latency": [],
              "overhead": [], "consistency": [], "rvd": address}
    try:
        for name in args.dtypes.split(","):
            dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[name]
            trainer = Trainer(args, dtype, device)
            params = sum(p.numel() for p in trainer.model.parameters())
            vset = sum(w.numel() * w.element_size() for w in trainer.v().values())
            result["model"] = (f"LlamaForCausalLM {args.layers} layers, hidden "
                               f"{args.hidden}, {args.heads} heads / {args.kv_heads} kv "
                               f"heads, MLP {args.ffn}, vocab {args.vocab}, batch "
                               f"{args.batch} x {args.seq} tokens, AdamW")
            result.setdefault("models", {})[name] = {
                "parameters": params, "v_set_bytes": vset,
                "autocast": trainer.autocast,
                "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu"}
            print(f"[{name}] {params / 1e9:.2f} B parameters, V set {vset / 2**20:.0f} MiB")
            if "check" in phases:
                result["check"].append(run_check(rvd, args, trainer, address, name))
            if "consistency" in phases:
                for broken in (False, True):
                    result["consistency"].append(
                        run_consistency(rvd, args, trainer, address, name, broken))
            if "latency" in phases:
                for per_head in (False, True):
                    result["latency"].append(
                        run_latency(rvd, args, trainer, address, name, per_head))
            if "overhead" in phases:
                # the fake rvd of --smoke-cpu has no Measure: ipc only there
                for transport in ("ipc",) if args.smoke_cpu else ("ipc", "copy"):
                    for interval in (50, 1):
                        saved = args.block_steps
                        if transport == "copy" and interval == 1:
                            args.block_steps = args.copy_block_steps
                        try:
                            result["overhead"].append(run_overhead(
                                rvd, args, trainer, address, name, transport, interval))
                        finally:
                            args.block_steps = saved
            del trainer
            if device.type == "cuda":
                torch.cuda.empty_cache()
    except Exception:  # the report still says what ran, and how it ended
        import traceback
        result["error"] = traceback.format_exc()
        print(result["error"], file=sys.stderr)
    finally:
        stop()
    result["verdicts"] = verdicts(result)
    out = pathlib.Path(args.out)
    (out / "live_train.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    md = markdown(result)
    (out / "live_train.md").write_text(md)
    print(md)
    ok = "error" not in result and all(c["exact"] and c["policy_ok"]
                                       for c in result["check"]) and \
        all(c["ok"] for c in result["consistency"])
    print("checks", "passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
