#!/usr/bin/python3
"""Load test: N clients stream measurements into one rvd for S seconds and
the daemon's RSS is sampled; prints the RSS curve and the outcome counts.

  RVD_BUILD_DIR=build /usr/bin/python3 scripts/load_rss.py [--clients 64]
      [--seconds 60] [--rvd PATH] [--env MALLOC_ARENA_MAX=2]

Each client sends 8 layers of 256x1024 f32 (8 MiB) by MeasureStream in 1 MiB
chunks, again and again. Uses the integration tests' harness (rvdtest.py);
writes nothing into the source tree.
"""
import argparse
import collections
import os
import pathlib
import sys
import tempfile
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests" / "integration"))
import rvdtest  # noqa: E402
from rvdtest import Daemon, grpc, rvd_pb2  # noqa: E402
import numpy as np  # noqa: E402


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--rvd", help="rvd binary (default: $RVD_BUILD_DIR/bin/rvd)")
    p.add_argument("--env", action="append", default=[], help="NAME=VALUE for rvd")
    args = p.parse_args()
    if args.rvd:
        rvdtest.RVD = pathlib.Path(args.rvd)
    for kv in args.env:
        k, v = kv.split("=", 1)
        os.environ[k] = v
    d = Daemon(pathlib.Path(tempfile.mkdtemp(prefix="rvd-load-")), engine_threads=2,
               compute_workers=2, log_level="warn")
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal((256, 1024)).astype(np.float32) for _ in range(8)]
    header = rvd_pb2.MeasureHeader(model_id="load", tensors=[
        rvd_pb2.TensorSpec(name=f"l{l}", layer=l, dtype=rvd_pb2.DTYPE_F32, shape=[256, 1024],
                           layout=rvd_pb2.V_LAYOUT_SEPARATE,
                           geometry=rvd_pb2.HeadGeometry(num_heads=4, num_kv_heads=4,
                                                         head_dim=64))
        for l in range(8)])
    blobs = [a.tobytes() for a in arrays]

    def messages():
        yield rvd_pb2.MeasureChunk(header=header)
        for i, b in enumerate(blobs):
            for off in range(0, len(b), 1 << 20):
                yield rvd_pb2.MeasureChunk(tensor_index=i, offset=off, data=b[off:off + (1 << 20)])

    outcomes = collections.Counter()
    latencies = []
    lock = threading.Lock()
    stop = time.time() + args.seconds

    def client():
        while time.time() < stop:
            t = time.time()
            try:
                d.stub.MeasureStream(messages(), timeout=60)
                code = "OK"
            except grpc.RpcError as e:
                code = e.code().name
            with lock:
                outcomes[code] += 1
                if code == "OK":
                    latencies.append(time.time() - t)

    threads = [threading.Thread(target=client) for _ in range(args.clients)]
    start = time.time()
    print(f"rss at start: {rss_mb(d.proc.pid):.0f} MB")
    for t in threads:
        t.start()
    peak = 0.0
    while any(t.is_alive() for t in threads):
        time.sleep(5)
        r = rss_mb(d.proc.pid)
        peak = max(peak, r)
        print(f"t={time.time() - start:5.0f}s rss={r:7.0f} MB", flush=True)
    for t in threads:
        t.join()
    latencies.sort()
    p99 = latencies[int(0.99 * (len(latencies) - 1))] if latencies else float("nan")
    print(f"peak rss {peak:.0f} MB, end rss {rss_mb(d.proc.pid):.0f} MB; outcomes {dict(outcomes)}; "
          f"p99 {p99:.2f} s")
    d.stop()


if __name__ == "__main__":
    main()
