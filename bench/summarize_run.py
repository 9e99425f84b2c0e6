#!/usr/bin/env python3
"""Summarizes one GPU host run as Markdown tables.

  /usr/bin/python3 bench/summarize_run.py LOGDIR [--prefix s9-5_] [--label NAME]

LOGDIR is what scripts/gpu_host_run.sh leaves under $OUT (gpu_bench.json,
sustain.json, torch_peers.json, e2e_gpu.json; logs.tgz with the step logs,
read without unpacking it), or a directory of such files with a common
prefix (--prefix). Every file is optional: a table is printed for each one
found. Prints, in this order: the device and engine, the tests' verdicts,
the validation, the issue's target cases in the three timing regimes
(isolated / synced / steady; docs/BENCHMARKING.md), the fused calls'
anatomy, --sustain's medians per kernel and mode, the PyTorch peers and the
end-to-end round trip. Standard library only: it runs on the GPU host too.
"""
import argparse
import json
import pathlib
import re
import statistics
import sys
import tarfile


def load_json(d, prefix, name):
    p = d / f"{prefix}{name}.json"
    if not p.exists():
        return None
    text = p.read_text().strip()
    if not text:
        return None
    if name == "e2e_gpu":  # one JSON object per line; the last is the summary
        text = text.splitlines()[-1]
    return json.loads(text)


def step_logs(d, prefix):
    """{step name: log text} from LOGDIR/PREFIX<step>.log and logs.tgz."""
    logs = {}
    for p in d.glob(f"{prefix}*.log"):
        logs[p.name[len(prefix):-len(".log")]] = p.read_text(errors="replace")
    tgz = d / f"{prefix}logs.tgz"
    if tgz.exists():
        with tarfile.open(tgz) as t:
            for m in t.getmembers():
                name = pathlib.PurePath(m.name).name
                if m.isfile() and name.endswith(".log"):
                    f = t.extractfile(m)
                    logs.setdefault(name[:-len(".log")], f.read().decode(errors="replace"))
    return logs


def shape(r):
    return f"{r['batch']} x {r['rows']}x{r['cols']} {r['dtype']}"


def ms(x):
    return f"{x:.4f}" if x < 10 else f"{x:.2f}"


def table(header, rows):
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")
    print()


def tests(logs):
    rows = []
    for name, text in sorted(logs.items()):
        m = re.search(r"\[  PASSED  \] (\d+) tests?", text)
        failed = re.search(r"\[  FAILED  \] (\d+) tests?", text)
        ran = re.search(r"\[==========\] (\d+) tests? from", text)
        py = re.search(r"^[= ]*((?:\d+ (?:passed|failed|skipped|errors?)(?:, )?)+) in [\d.]+s",
                       text, re.M)
        if ran:
            verdict = f"{m.group(1) if m else 0}/{ran.group(1)} passed"
            if failed:
                verdict += f", {failed.group(1)} failed"
        elif py:
            verdict = py.group(1)
        else:
            continue
        rows.append((name, verdict))
    if rows:
        print("Tests")
        print()
        table(["step", "verdict"], rows)


def validation(bench):
    v = bench.get("validation", [])
    if not v:
        return
    ok = sum(1 for r in v if r.get("ok"))
    print(f"Validation against the float64 SVD oracle: {ok} of {len(v)} ok "
          "(tolerance 2e-6 relative).")
    print()
    table(["variant", "case", "max rel. error"],
          [(r["variant"], shape(r), f"{r['max_rel_err']:.2e}") for r in v
           if r["variant"] == "fused"])


def targets(bench):
    rows = []
    for t in bench.get("timing", []):
        if t.get("case") not in ("issue", "dtype", "tall"):
            continue
        target = t.get("target_ms", 0.0)
        met = ("yes" if t["isolated_ms"] <= target else "no") if target > 0 else ""
        rows.append((shape(t), ms(t["isolated_ms"]), ms(t["synced_ms"]), ms(t["steady_ms"]),
                     ms(t["floor_ms"]), f"{t['pct_of_floor']:.0f}%",
                     ms(target) if target > 0 else "", met, f"`{t['policy']}`"))
    if rows:
        tg = bench.get("targets", {})
        print("Kernel + finalize, ms (median; floor = input bytes / the copy ceiling; "
              "%floor from isolated)")
        print()
        table(["case", "isolated", "synced", "steady", "floor", "%floor", "target",
               "met (isolated)", "served by"], rows)
        if tg:
            print(f"Targets met: {tg['met_isolated']} of {tg['cases']} in isolated calls, "
                  f"{tg['met_steady']} of {tg['cases']} at steady load.")
            print()


def calls(bench):
    rows = [(shape(c), ms(c["call_ms"]), ms(c["repeat_call_ms"]), ms(c["plan_ms"]),
             ms(c["isolated_ms"])) for c in bench.get("calls", [])
            if c.get("case") == "issue"]
    if rows:
        print("Fused calls, wall clock ms (median): a new plan, the plan reused, "
              "the host's planning, the kernels alone (isolated)")
        print()
        table(["case", "new plan", "plan reused", "planning", "kernels"], rows)


def lineup(bench):
    rows = [(r["dtype"], r["label"], ms(r["call_ms"]),
             f"{r['max_rel_err']:.1e} (max)" if r["exact"] else
             f"{r['mean_rel_err']:.1e} (mean), p95 {r['p95_rel_err']:.1e}",
             f"`{r['served']}`") for r in bench.get("lineup", [])]
    if rows:
        print("Every variant on 480 x 128x4096 (one call, wall clock, median)")
        print()
        table(["dtype", "variant", "call ms", "error vs float64 SVD", "served by"], rows)


def estimators(bench):
    """Mean / p95 relative error per estimator and spectrum family."""
    cells, spectra = {}, []
    for r in bench.get("estimators", []):
        if r["spectrum"] not in spectra:
            spectra.append(r["spectrum"])
        cells.setdefault(r["estimator"], {})[r["spectrum"]] = (
            f"{100 * r['mean_rel_err']:.1f}% / {100 * r['p95_rel_err']:.1f}%")
    if cells:
        print("Estimators against the float64 SVD oracle, mean / p95 relative error of PR")
        print()
        table(["estimator", *spectra],
              [(e, *(c.get(sp, "") for sp in spectra)) for e, c in cells.items()])


def sustain(s):
    # Median per (case, kernel, mode) over the alternating blocks; the
    # spread is max - min of those blocks.
    groups = {}
    for r in s.get("sustain", []):
        groups.setdefault((shape(r), r["kernel"]), {}).setdefault(r["mode"], []).append(
            r["kernel_ms"])
    rows = []
    for (case, kernel), modes in groups.items():
        cells = []
        for mode in ("spaced", "synced", "queued"):
            v = modes.get(mode, [])
            if not v:
                cells.append("")
            elif len(v) == 1:
                cells.append(ms(v[0]))
            else:
                cells.append(f"{ms(statistics.median(v))} ({len(v)} blocks, "
                             f"spread {max(v) - min(v):.4f})")
        rows.append((case, kernel, *cells))
    if rows:
        print("--sustain, kernel + finalize ms, median of 100 ms windows: spaced = "
              "isolated (5 ms idle after each launch), synced, queued = steady (at "
              "the power cap)")
        print()
        table(["case", "kernel", "spaced", "synced", "queued"], rows)


def torch_peers(t):
    names = {
        "torch_bmm_fp32_ieee": "torch bmm Gram + norms, fp32 IEEE (480 x 128x4096)",
        "torch_bmm_fp32_tf32": "torch bmm Gram + norms, TF32",
        "torch_bmm_bf16_in": "torch, bf16 weights upcast, TF32",
        "torch_per_layer_gqa_bf16_tf32": "torch, 32 x 1024x4096 bf16 whole-layer PR, TF32",
        "torch_gram_eigvalsh_fp32": "torch Gram + eigvalsh, fp32",
        "torch_svdvals_fp32": "torch linalg.svdvals, fp32",
    }
    rows = []
    for key, label in names.items():
        v = t.get(key)
        if isinstance(v, dict):
            err = f"{v['max_rel_err']:.1e}" if "max_rel_err" in v else ""
            rows.append((label, ms(v["ms"]), err))
    if "numpy_svd_cpu_ms_per_matrix" in t:
        rows.append(("numpy SVD on the host's CPU, per matrix",
                     ms(t["numpy_svd_cpu_ms_per_matrix"]), ""))
    if rows:
        print(f"PyTorch peers (bench/torch_peers.py): copy ceiling "
              f"{t.get('copy_TBps_rw', 0):.3f} TB/s; host-to-device pageable / pinned "
              f"{t.get('h2d_pageable_GBps', 0):.1f} / {t.get('h2d_pinned_GBps', 0):.1f} GB/s")
        print()
        table(["peer", "ms", "max rel. error vs float64 SVD"], rows)


def e2e(e):
    print(f"End to end (bench/e2e_gpu.py, {e['bytes'] >> 20} MiB, {e['rounds']} rounds, "
          f"{e['backend']}/{e['variant']}), median ms")
    print()
    table(["read", "transfer", "engine", "of it H2D", "plan", "compute", "round trip"],
          [(ms(e["read_ms"]), ms(e["transfer_ms"]), ms(e["engine_ms"]), ms(e["h2d_ms"]),
            ms(e.get("plan_ms", 0.0)), ms(e["compute_ms"]), ms(e["round_trip_ms"]))])


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("logdir", type=pathlib.Path)
    p.add_argument("--prefix", default="", help="file name prefix, e.g. s9-5_")
    p.add_argument("--label", default="", help="a heading for the run")
    a = p.parse_args(argv)
    if not a.logdir.is_dir():
        sys.exit(f"{a.logdir}: not a directory")
    # --quick runs were saved as gpu_bench_quick.json.
    bench = (load_json(a.logdir, a.prefix, "gpu_bench") or
             load_json(a.logdir, a.prefix, "gpu_bench_quick"))
    sus = load_json(a.logdir, a.prefix, "sustain")
    peers = load_json(a.logdir, a.prefix, "torch_peers")
    e = load_json(a.logdir, a.prefix, "e2e_gpu")
    logs = step_logs(a.logdir, a.prefix)
    if not any((bench, sus, peers, e, logs)):
        sys.exit(f"{a.logdir}: no run files with prefix '{a.prefix}'")
    if a.label:
        print(f"### {a.label}")
        print()
    head = bench or sus
    if head:
        print(f"Device {head.get('device', '?')}, copy ceiling {head['copy_TBps']:.3f} TB/s "
              f"(D2D, read + write); engine `{head.get('version', '?')}`.")
        print()
    tests(logs)
    if bench:
        validation(bench)
        targets(bench)
        calls(bench)
        lineup(bench)
        estimators(bench)
    if sus:
        sustain(sus)
    if peers:
        torch_peers(peers)
    if e:
        e2e(e)


if __name__ == "__main__":
    main(sys.argv[1:])
