"""`rvctl measure` of a local checkpoint end to end, rvd reading it itself
(MeasurePath: the daemon maps the files, nothing crosses gRPC) against
streaming it (MeasureStream: 4 MiB chunks) and against what a NumPy user
runs in-process (map the safetensors, `w @ w.T` per layer), on the same
matrices in the same run, interleaved A-B-C-A-B-C.

  /usr/bin/python3 bench/checkpoint_path_bench.py [--layers 64] [--rounds 7] [--align 8]

Each layer's V is 128 x 4096 f32 (a 32-head, 4096-wide model with one kv
head of 128), power-law spectrum: 64 layers are 128 MiB. The checkpoint
and rvd's config live in a temporary directory, removed at the end. Prints
each path's median, min and max, the ratios of medians, and the worst-case
pairing (slowest of ours against fastest of theirs). --align N pads the
safetensors header so that the data section starts at a multiple of N
bytes (8, the default, is what the safetensors writer does; 64 puts every
tensor on a cache line, which the CPU engine reads faster).
"""
import argparse
import json
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests" / "integration"))
import numpy as np  # noqa: E402

from rvdtest import RVCTL, Daemon, spectrum_matrix  # noqa: E402


def write_aligned(path, tensors, align):
    """write_safetensors with the data section at a multiple of `align`."""
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        blob = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % align)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for blob in blobs:
            f.write(blob)
    return (8 + len(text)) % 64


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
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--align", type=int, default=8)
    args = p.parse_args()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="rvd-ckpt-bench-"))
    try:
        run(tmp, args)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(tmp, args):
    root = tmp / "checkpoints"
    model = root / "model"
    model.mkdir(parents=True)
    seed = 0
    rng = np.random.default_rng(seed)
    print(f"seed {seed}")
    tensors = {f"model.layers.{l}.self_attn.v_proj.weight":
               spectrum_matrix(rng, 128, 4096, 0.7) for l in range(args.layers)}
    misalign = write_aligned(model / "model.safetensors", tensors, args.align)
    (model / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": args.layers,
        "num_attention_heads": 32, "num_key_value_heads": 1, "hidden_size": 4096}))
    daemon = Daemon(tmp, checkpoint_roots=[str(root)])
    times = {"path": [], "stream": [], "numpy": []}
    outs = {}
    try:
        def rvctl(transfer):
            r = subprocess.run([str(RVCTL), "--address", daemon.grpc_address, "measure",
                                str(model), "--model-id", "bench", "--json",
                                "--transfer", transfer],
                               capture_output=True, text=True, check=True)
            out = json.loads(r.stdout)
            assert out["transfer"] == transfer, out
            return out
        rvctl("path")  # warm-up: page cache, connection, buffers
        rvctl("stream")
        gram_path(model / "model.safetensors", args.layers)
        for _ in range(args.rounds):
            t, outs["path"] = timed(lambda: rvctl("path")); times["path"].append(t)
            t, outs["stream"] = timed(lambda: rvctl("stream")); times["stream"].append(t)
            t, ref = timed(lambda: gram_path(model / "model.safetensors", args.layers))
            times["numpy"].append(t)
    finally:
        daemon.stop()

    ref = np.array(ref)
    for name in ("path", "stream"):
        got = np.array([outs[name]["per_layer_pr"][str(l)] for l in range(args.layers)])
        err = float(np.max(np.abs(got - ref) / ref))
        assert err < 1e-4, (name, err)
    path_out = outs["path"]

    def fmt(ts):
        return (f"median {statistics.median(ts) * 1e3:7.1f} ms  "
                f"(min {min(ts) * 1e3:.1f}, max {max(ts) * 1e3:.1f})")
    mib = args.layers * 128 * 4096 * 4 / 2**20
    print(f"{args.layers} layers of 128x4096 f32 ({mib:.0f} MiB), {args.rounds} rounds, "
          f"interleaved path-stream-numpy; {path_out['backend']}/{path_out['variant']}; "
          f"tensors at offset {misalign} mod 64 in the file")
    print(f"A rvctl measure, rvd reads it (MeasurePath): {fmt(times['path'])}; "
          f"rvd mapped it in {path_out['receive_ms']:.1f} ms, engine {path_out['elapsed_ms']:.1f} ms")
    print(f"B rvctl measure, streamed (MeasureStream):   {fmt(times['stream'])}; "
          f"receive {outs['stream']['receive_ms']:.1f} ms, engine {outs['stream']['elapsed_ms']:.1f} ms")
    print(f"C numpy in-process map + w@w.T per layer:    {fmt(times['numpy'])}")
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"A vs numpy: {med['numpy'] / med['path']:.2f}x (worst-case pairing "
          f"{min(times['numpy']) / max(times['path']):.2f}x); "
          f"B vs numpy: {med['numpy'] / med['stream']:.2f}x; A vs B: {med['stream'] / med['path']:.2f}x")
    print("max relative PR difference rvd vs numpy: < 1e-4 (checked)")


if __name__ == "__main__":
    main()
