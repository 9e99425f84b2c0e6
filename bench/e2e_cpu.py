"""End to end on the CPU: `rvctl measure` of a 64-layer checkpoint through a
running rvd, against what a NumPy user runs instead (load the safetensors,
then an SVD per layer, or `w @ w.T` per layer), interleaved A-B-A-B.

  /usr/bin/python3 bench/e2e_cpu.py [--layers 64] [--rounds 3]

Each layer's V is 128 x 4096 f32 (a 32-head, 4096-wide model with one kv
head of 128), power-law spectrum. Prints medians, the spread and ratios.
"""
import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests" / "integration"))
import numpy as np  # noqa: E402

from rvdtest import RVCTL, Daemon, spectrum_matrix, write_safetensors  # noqa: E402


def load_v(path, layers):
    """The NumPy user's loader: parse the safetensors header, map the V tensors."""
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    n = int.from_bytes(raw[:8].tobytes(), "little")
    header = json.loads(raw[8:8 + n].tobytes())
    out = []
    for l in range(layers):
        h = header[f"model.layers.{l}.self_attn.v_proj.weight"]
        a, b = h["data_offsets"]
        out.append(np.frombuffer(raw[8 + n + a:8 + n + b], np.float32).reshape(h["shape"]))
    return out


def svd_path(path, layers):
    prs = []
    for w in load_v(path, layers):
        s = np.linalg.svd(w, compute_uv=False).astype(np.float64)
        s2 = s * s
        prs.append(s2.sum() ** 2 / (s2 * s2).sum())
    return prs


def gram_path(path, layers):
    prs = []
    for w in load_v(path, layers):
        g = w @ w.T
        f2 = float(np.vdot(w, w))
        prs.append(f2 * f2 / float(np.vdot(g, g)))
    return prs


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="rvd-bench-"))
    model = tmp / "model"
    model.mkdir()
    rng = np.random.default_rng(0)
    tensors = {f"model.layers.{l}.self_attn.v_proj.weight":
               spectrum_matrix(rng, 128, 4096, 0.7) for l in range(args.layers)}
    write_safetensors(model / "model.safetensors", tensors)
    (model / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": args.layers,
        "num_attention_heads": 32, "num_key_value_heads": 1, "hidden_size": 4096}))
    daemon = Daemon(tmp)
    ours, svd, gram = [], [], []
    try:
        def rvctl():
            r = subprocess.run([str(RVCTL), "--address", daemon.grpc_address, "measure",
                                str(model), "--model-id", "bench", "--json"],
                               capture_output=True, text=True, check=True)
            return json.loads(r.stdout)
        rvctl()  # warm-up: page cache, connection
        for _ in range(args.rounds):
            t, out = timed(rvctl); ours.append(t)
            t, ref = timed(lambda: svd_path(model / "model.safetensors", args.layers)); svd.append(t)
            t, _ = timed(lambda: gram_path(model / "model.safetensors", args.layers)); gram.append(t)
        got = np.array([out["per_layer_pr"][str(l)] for l in range(args.layers)])
        err = float(np.max(np.abs(got - np.array(ref)) / np.array(ref)))
        engine_ms = out["elapsed_ms"]
    finally:
        daemon.stop()

    def fmt(ts):
        return f"median {statistics.median(ts) * 1e3:8.1f} ms  (min {min(ts) * 1e3:.1f}, max {max(ts) * 1e3:.1f})"
    print(f"{args.layers} layers of 128x4096 f32, {args.rounds} rounds, interleaved")
    print(f"rvctl measure (end to end):  {fmt(ours)}; engine {engine_ms:.1f} ms "
          f"[{out['backend']}/{out['variant']}]")
    print(f"numpy load + SVD per layer:  {fmt(svd)}")
    print(f"numpy load + w@w.T per layer: {fmt(gram)}")
    print(f"end to end vs SVD path: {statistics.median(svd) / statistics.median(ours):.1f}x "
          f"(worst-case pairing {min(svd) / max(ours):.1f}x); "
          f"vs numpy Gram path: {statistics.median(gram) / statistics.median(ours):.2f}x")
    print(f"max relative difference rvd vs numpy SVD: {err:.2e}")


if __name__ == "__main__":
    main()
