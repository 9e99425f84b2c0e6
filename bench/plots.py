"""Pictures from rvd_bench_gpu's JSON: a roofline and an accuracy-latency
Pareto plot, as PNG (matplotlib; Debian: python3-matplotlib).

  /usr/bin/python3 bench/plots.py gpu_bench.json [--torch torch_peers.json] [--out DIR]

Writes DIR/roofline.png and DIR/pareto.png (DIR: the current directory by
default; --out bench/ replaces the committed pictures that bench/RESULTS.md
shows).

Roofline: each timed case at its arithmetic intensity (Gram FLOPs of the
upper triangle over the bytes of W, read once) against the measured copy
ceiling and the bf16 tensor-core rate. Pareto: relative error vs time of
one engine call for every variant on 480 x 128x4096 f32 (exact: largest
error; estimators: mean error, bar to p95) and the torch peers.
"""
import argparse
import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

BF16_TFLOPS = 790.0  # measured bf16 matrix rate on the H200 (device KINDS.md)
DSIZE = {"f32": 4, "f16": 2, "bf16": 2}


def roofline(bench, torch, out):
    bw = bench["copy_TBps"]
    fig, ax = plt.subplots(figsize=(10, 5))
    xs = [0.5 * 1.1 ** i for i in range(90)]  # 0.5 .. ~2700 FLOP/byte
    ax.plot(xs, [min(x * bw, BF16_TFLOPS) for x in xs], "k-", lw=1,
            label=f"ceiling: {bw:.2f} TB/s copy, {BF16_TFLOPS:.0f} TFLOP/s bf16")
    for t in bench["timing"]:
        nbytes = t["batch"] * t["rows"] * t["cols"] * DSIZE[t["dtype"]]
        n = min(t["rows"], t["cols"])
        flops = t["batch"] * n * n * max(t["rows"], t["cols"])  # upper triangle x 2
        intensity = flops / nbytes
        for key, marker, name in (("isolated_ms", "o", "fused"),
                                  ("algebraic_call_ms", "s", "algebraic (cuBLAS)")):
            if key in t:
                ax.scatter(intensity, flops / (t[key] * 1e-3) / 1e12, marker=marker,
                           label=f"{name} {t['batch']}x{t['rows']}x{t['cols']} {t['dtype']}")
    if torch:
        for key, val in torch.items():
            if isinstance(val, dict) and "ms" in val and "bytes_GB" in val:
                flops = 480 * 128 * 128 * 4096
                ax.scatter(flops / (val["bytes_GB"] * 1e9),
                           flops / (val["ms"] * 1e-3) / 1e12, marker="x", label=key)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte of W)")
    ax.set_ylabel("TFLOP/s (upper-triangle Gram)")
    ax.set_title(f"rvd PR engine on {bench.get('device', 'GPU')}")
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.tight_layout()
    fig.savefig(out / "roofline.png", dpi=130)


def pareto(bench, torch, out):
    """Every variant on 480 x 128x4096 f32 (the benchmark's "lineup": one
    engine call each, against the float64 SVD): exact variants at their
    largest error, estimators at their mean error with a bar up to p95;
    the torch peers at their largest error."""
    fig, ax = plt.subplots(figsize=(10, 5))
    for v in bench.get("lineup", []):
        if v["batch"] != 480 or v["dtype"] != "f32":
            continue
        if v["exact"]:
            ax.scatter(v["call_ms"], max(v["max_rel_err"], 1e-12), marker="o",
                       label=f"{v['label']} (max)")
        else:
            mean = max(v["mean_rel_err"], 1e-12)
            ax.errorbar(v["call_ms"], mean, yerr=[[0], [max(v["p95_rel_err"] - mean, 0)]],
                        marker="^", capsize=3, label=f"{v['label']} (mean, bar to p95)")
    for key, val in (torch or {}).items():
        if isinstance(val, dict) and "max_rel_err" in val:
            ax.scatter(val["ms"], val["max_rel_err"], marker="x", label=f"torch {key} (max)")
    ax.axhline(2e-6, color="grey", ls="--", lw=1, label="exact: 2e-6")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("time of one call, 480 x 128x4096 f32 (ms)")
    ax.set_ylabel("relative error vs float64 SVD")
    ax.set_title("accuracy vs latency")
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.tight_layout()
    fig.savefig(out / "pareto.png", dpi=130)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("bench")
    p.add_argument("--torch")
    p.add_argument("--out", default=".")
    args = p.parse_args()
    bench = json.loads(pathlib.Path(args.bench).read_text())
    torch = json.loads(pathlib.Path(args.torch).read_text()) if args.torch else None
    out = pathlib.Path(args.out)
    roofline(bench, torch, out)
    pareto(bench, torch, out)
    print(f"wrote {out / 'roofline.png'} and {out / 'pareto.png'}")


if __name__ == "__main__":
    main()
