"""End to end on a GPU host: a copy-mode measurement of a 7B model's V heads
(32 layers of GQA v_proj, 8 kv heads x 128 x 4096, bf16: 256 head matrices,
256 MiB) from rvctl through rvd with the CUDA backend. Splits the time into
read (rvctl maps and checks the checkpoint), transfer (rvd receives the
stream), engine (host-to-device copies, planning and compute; split by the
growth of rvd_engine_seconds_total{phase="h2d"|"plan"|"compute"} in
/metrics around each call) and the rest. Also counts the matrices whose
call reused its plan (rvd_engine_events_total{event="fused_plan_reused"}).

  python3 bench/e2e_gpu.py [--rounds 5] [--backend cuda]
"""
import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests" / "integration"))
import numpy as np  # noqa: E402

from rvdtest import RVCTL, Daemon, to_bf16, write_safetensors  # noqa: E402


def engine_counters(daemon):
    """rvd_engine_seconds_total by phase, and the matrices whose plan was
    reused, from the daemon's /metrics."""
    text = urllib.request.urlopen(f"http://{daemon.metrics_address}/metrics",
                                  timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("rvd_engine_seconds_total{"):
            phase = line.split('phase="')[1].split('"')[0]
            out[phase] = float(line.split()[-1])
        elif line.startswith("rvd_engine_events_total{") and 'event="fused_plan_reused"' in line:
            out["plans_reused"] = float(line.split()[-1])
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--backend", default="cuda")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--transfer", choices=["stream", "path"], default="stream",
                   help="stream: rvctl sends the tensors (MeasureStream); path: rvd "
                        "maps the checkpoint itself (MeasurePath, checkpoint_roots), "
                        "transfer_ms is then rvd's map and check")
    args = p.parse_args()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="rvd-e2e-"))
    model = tmp / "model"
    model.mkdir()
    rng = np.random.default_rng(0)
    tensors = {}
    for l in range(args.layers):
        w = rng.standard_normal((1024, 4096), dtype=np.float32)
        w *= (np.arange(1, 4097, dtype=np.float32) ** -0.35)
        tensors[f"model.layers.{l}.self_attn.v_proj.weight"] = ("BF16", to_bf16(w)[1])
    write_safetensors(model / "model.safetensors", tensors)
    (model / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": args.layers, "num_attention_heads": 32,
        "num_key_value_heads": 8, "hidden_size": 4096}))
    roots = {"checkpoint_roots": [str(tmp)]} if args.transfer == "path" else {}
    d = Daemon(tmp, backend=args.backend, max_request_bytes=1 << 30, **roots)
    rows = []
    try:
        cmd = [str(RVCTL), "--address", d.grpc_address, "measure", str(model),
               "--model-id", "llama-7b-heads", "--per-head", "--json",
               "--transfer", args.transfer]
        subprocess.run(cmd, capture_output=True, check=True)  # warm-up
        for _ in range(args.rounds):
            before = engine_counters(d)
            out = json.loads(subprocess.run(cmd, capture_output=True, text=True,
                                            check=True).stdout)
            after = engine_counters(d)
            for phase in ("h2d", "plan", "compute"):
                out[f"{phase}_ms"] = 1e3 * (after.get(phase, 0.0) - before.get(phase, 0.0))
            out["plans_reused"] = after.get("plans_reused", 0) - before.get("plans_reused", 0)
            rows.append(out)
    finally:
        d.stop()

    def med(key):
        return statistics.median(r[key] for r in rows)
    read, total = med("client_load_ms"), med("client_round_trip_ms")
    receive, engine = med("receive_ms"), med("elapsed_ms")
    h2d, plan, compute = med("h2d_ms"), med("plan_ms"), med("compute_ms")
    nbytes = args.layers * 1024 * 4096 * 2
    print(json.dumps({"rounds": args.rounds, "bytes": nbytes, "transfer": args.transfer,
                      "backend": rows[0]["backend"],
                      "variant": rows[0]["variant"], "engine_version": rows[0]["engine_version"],
                      "read_ms": read, "transfer_ms": receive, "engine_ms": engine,
                      "h2d_ms": h2d, "plan_ms": plan, "compute_ms": compute,
                      "plans_reused_per_round": med("plans_reused"),
                      "round_trip_ms": total, "other_ms": total - receive - engine,
                      "engine_ms_all": [r["elapsed_ms"] for r in rows],
                      "round_trip_ms_all": [r["client_round_trip_ms"] for r in rows]}))
    print(f"{nbytes / 2**20:.0f} MiB, {args.layers} layers + {args.layers * 8} heads, "
          f"{rows[0]['backend']}/{rows[0]['variant']} ({rows[0]['engine_version']})")
    print(f"read {read:.1f} ms | transfer {receive:.1f} ms ({nbytes / receive / 1e6:.2f} GB/s) | "
          f"engine {engine:.2f} ms (H2D {h2d:.2f} + plan {plan:.2f} + compute {compute:.2f}; "
          f"{med('plans_reused'):.0f} matrices on a reused plan) | "
          f"round trip {total:.1f} ms")


if __name__ == "__main__":
    main()
