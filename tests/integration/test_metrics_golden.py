"""Golden-file test of /metrics: a fixed input through a fresh daemon, and
its exposition compared with tests/integration/golden/metrics.txt.

The same series must be there, with the same labels. Series whose values
depend on time (durations, timestamps) are compared by name and labels
only, rvd_build_info by name only (its labels name this machine's kernel);
other values within 1e-6 relative, so that another CPU's rounding in the
last bits of a PR does not matter. To accept a change on
purpose: RVD_UPDATE_GOLDEN=1 ctest -R integration (then review the diff).
"""
import os
import pathlib
import re
import urllib.request

import numpy as np

from rvdtest import Daemon, rvd_pb2

GOLDEN = pathlib.Path(__file__).parent / "golden" / "metrics.txt"
TIME_DEPENDENT = ("rvd_measurement_duration_seconds", "rvd_last_measurement_timestamp_seconds",
                  "rvd_request_duration_seconds", "rvd_compute_queue_wait_seconds_total",
                  "rvd_engine_seconds_total")
# Labels or values that depend on this machine's kernel (cpu-avx512-1 or
# cpu-openblas-1): which Gram path served (rvd_engine_matrices_total) is
# compared by name and labels only.
MACHINE_DEPENDENT = ("rvd_build_info",)
PATH_DEPENDENT = ("rvd_engine_matrices_total",)


def normalize(text):
    lines = []
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith("rvd_"):
            continue
        name, _, value = line.rpartition(" ")
        if name.startswith(MACHINE_DEPENDENT):
            lines.append(name.split("{")[0])
        elif name.startswith(TIME_DEPENDENT + PATH_DEPENDENT):
            lines.append(name)  # present, value not compared
        else:
            lines.append(f"{name} {float(value):.9g}")
    return "\n".join(sorted(lines)) + "\n"


def series(text):
    """name{labels} -> value (None where the value is not compared)."""
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        out[name] = float(value) if value else None
    return out


def fixed_request(model_id, step):
    """Deterministic, non-trivial weights: a scaled integer pattern."""
    tensors, data = [], []
    for layer in range(4):
        i = np.arange(16 * 64, dtype=np.float64).reshape(16, 64)
        w = (np.sin(i * (layer + 1) * 0.37) * (1 + np.arange(16)[:, None]) ** -0.5).astype(np.float32)
        tensors.append(rvd_pb2.TensorSpec(
            name=f"model.layers.{layer}.self_attn.v_proj.weight", layer=layer,
            dtype=rvd_pb2.DTYPE_F32, shape=[16, 64], layout=rvd_pb2.V_LAYOUT_SEPARATE,
            geometry=rvd_pb2.HeadGeometry(num_heads=4, num_kv_heads=2, head_dim=8)))
        data.append(w.tobytes())
    header = rvd_pb2.MeasureHeader(model_id=model_id, step=step, tensors=tensors, per_head=True)
    return rvd_pb2.MeasureRequest(header=header, data=data)


def test_metrics_match_golden_file(tmp_path):
    d = Daemon(tmp_path, per_head_metrics=True, rv_alert_threshold=1.5)
    try:
        # One watcher attached throughout: rvd_watchers 1.
        watch = d.stub.WatchMeasurements(rvd_pb2.WatchRequest(model_id="golden-a"))
        watch.initial_metadata()
        d.stub.Measure(fixed_request("golden-a", 1))
        d.stub.Measure(fixed_request("golden-b", 2))
        d.stub.Measure(fixed_request("golden-a", 3))
        bad = fixed_request("golden-bad", 1)
        bad.header.model_id = "not valid!"
        try:
            d.stub.Measure(bad)
        except Exception:  # noqa: BLE001 - the error is what we count
            pass
        text = urllib.request.urlopen(f"http://{d.metrics_address}/metrics",
                                      timeout=5).read().decode()
        watch.cancel()
    finally:
        d.stop()
    got = normalize(text)
    if os.environ.get("RVD_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(got)
    want, have = series(GOLDEN.read_text()), series(got)
    assert sorted(have) == sorted(want), (
        f"series only in golden: {sorted(set(want) - set(have))}; "
        f"only now: {sorted(set(have) - set(want))}")
    differ = [f"{k}: golden {want[k]}, now {have[k]}" for k in want
              if want[k] is not None and abs(have[k] - want[k]) > 1e-6 * abs(want[k])]
    assert not differ, "values differ from golden/metrics.txt:\n" + "\n".join(differ)
    assert re.search(r'rvd_rv\{model_id="golden-a"\}', got)
