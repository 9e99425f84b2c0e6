#!/usr/bin/env python3
"""Places rvd_bench_gpu --sustain timings against nvidia-smi's samples.

  bench/smi_align.py SUSTAIN.json SMI.csv

SMI.csv is what scripts/gpu_host_run.sh records through a whole host call
(nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,... -lms 50);
SUSTAIN.json is the bench's --sustain output, whose 100 ms windows carry the
wall clock. Prints, per case, kernel and mode, the median kernel time and the
median SM clock and power over the same windows (queued: after its first
0.3 s, as the bench's own median). Standard library only: it runs on the
GPU host too.
"""
import csv
import datetime
import json
import statistics
import sys


def smi_samples(path):
    """(epoch seconds, SM MHz, watts) per sample; the header and junk skipped."""
    out = []
    with open(path) as f:
        for row in csv.reader(f):
            try:
                t = datetime.datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f")
                mhz = int(row[1].split()[0])
                watts = float(row[3].split()[0])
            except (ValueError, IndexError):
                continue
            out.append((t.replace(tzinfo=datetime.timezone.utc).timestamp(), mhz, watts))
    return out


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__)
    runs = json.load(open(argv[1]))["sustain"]
    samples = smi_samples(argv[2])
    print(f"{'case':<22} {'kernel':<38} {'mode':<7} {'ms':>7} {'SM MHz':>7} {'W':>5}")
    for r in runs:
        series = r["series"]
        start = series[0]["wall_s"] + (0.3 if r["mode"] == "queued" else 0.0)
        end = series[-1]["wall_s"] + 0.1
        ms = [w["ms"] for w in series if w["wall_s"] >= start]
        during = [s for s in samples if start <= s[0] < end]
        mhz = statistics.median(s[1] for s in during) if during else float("nan")
        watts = statistics.median(s[2] for s in during) if during else float("nan")
        case = f"{r['batch']} x {r['rows']}x{r['cols']} {r['dtype']}"
        print(f"{case:<22} {r.get('kernel', '?'):<38} {r['mode']:<7} "
              f"{statistics.median(ms):7.4f} {mhz:7.0f} {watts:5.0f}")


if __name__ == "__main__":
    main(sys.argv)
