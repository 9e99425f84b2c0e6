#!/usr/bin/env python3
"""What RVMonitor (copy transport) costs a training loop: a benchmark, not a
test (issue 15 section 6, "the same, copy transport").

    python3 tests/python/bench_overhead.py --address 127.0.0.1:50051 \\
        --device cuda --dtype bf16 --layers 32 --hidden 4096 --heads 32 --kv-heads 8

A llama-shaped model (tests/python/models.py; V [kv_heads*d, hidden] per
layer: the default is a 7B V set, 32 x 1024x4096) trains on synthetic input
with AdamW. For each interval in --intervals, --blocks blocks of --steps
steps run detached and attached in turn (A-B-A-B, each block's first step
dropped as warm-up); a step's time includes a device synchronization. It
prints, per interval, the median step time of each arm, the overhead (the
median over block pairs of attached/detached - 1, with the spread of the
pairs) and the time inside monitor.step() on measuring and other steps,
then one JSON line. rvd must be running at --address.
"""
import argparse
import json
import pathlib
import statistics
import sys
import time

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1] / "client" / "python"), str(HERE)]

import models  # noqa: E402
import rvd  # noqa: E402


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--address", default="127.0.0.1:50051")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--steps", type=int, default=21)
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--intervals", default="50,1")
    args = ap.parse_args()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    model = models.LlamaForCausalLM(layers=args.layers, heads=args.heads,
                                    kv_heads=args.kv_heads, hidden=args.hidden,
                                    dtype=dtype, spectrum=False).to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    x = torch.randn(args.batch, args.seq, args.hidden, device=args.device, dtype=dtype)

    def train_step():
        opt.zero_grad(set_to_none=True)
        model(x).float().square().mean().backward()
        opt.step()

    for _ in range(3):
        train_step()
    sync(args.device)
    client = rvd.Client(args.address)
    results = []
    for interval in (int(i) for i in args.intervals.split(",")):
        mon = rvd.RVMonitor(model, mode="training", measurement_interval=interval,
                            on_error="raise", client=client, transport="copy")
        arms = {"detached": [], "attached": []}
        pairs, in_step = [], {"measuring": [], "other": []}
        for b in range(args.blocks):
            order = ("detached", "attached") if b % 2 == 0 else ("attached", "detached")
            block = {}
            for arm in order:
                times = []
                for s in range(args.steps):
                    t0 = time.perf_counter()
                    train_step()
                    if arm == "attached":
                        n = len(mon.history)
                        t1 = time.perf_counter()
                        mon.step()
                        dt = time.perf_counter() - t1
                        in_step["measuring" if len(mon.history) > n else "other"].append(dt)
                    sync(args.device)
                    if s > 0:
                        times.append(time.perf_counter() - t0)
                block[arm] = statistics.median(times)
                arms[arm] += times
            pairs.append(block["attached"] / block["detached"] - 1)
        r = {"interval": interval, "device": args.device, "dtype": args.dtype,
             "v_bytes": sum(m.weight.numel() * m.weight.element_size()
                            for m in mon._modules.values()),
             "step_ms_detached": 1e3 * statistics.median(arms["detached"]),
             "step_ms_attached": 1e3 * statistics.median(arms["attached"]),
             "overhead": statistics.median(pairs), "overhead_min": min(pairs),
             "overhead_max": max(pairs),
             "monitor_step_ms_measuring": 1e3 * statistics.median(in_step["measuring"])
             if in_step["measuring"] else None,
             "monitor_step_ms_other": 1e3 * statistics.median(in_step["other"])
             if in_step["other"] else None,
             "measurements": len(mon.history)}
        results.append(r)
        print(f"interval {interval}: step {r['step_ms_detached']:.2f} ms detached, "
              f"{r['step_ms_attached']:.2f} ms attached; overhead "
              f"{100 * r['overhead']:+.2f}% (pairs {100 * r['overhead_min']:+.2f}% .. "
              f"{100 * r['overhead_max']:+.2f}%); monitor.step() "
              f"{r['monitor_step_ms_measuring']} ms measuring, "
              f"{r['monitor_step_ms_other']} ms other; "
              f"V set {r['v_bytes'] / 2**20:.0f} MiB")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
