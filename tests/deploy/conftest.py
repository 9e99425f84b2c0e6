"""Fixtures of the deploy tests: the metric families a real rvd exports.

`exported` starts the built rvd ($RVD_BUILD_DIR/bin/rvd, found through
tests/integration/rvdtest.py; on loopback, CPU backend) with per-head metrics and an R_V floor, sends it one
good and one bad measurement so that every family that appears only once it
has a sample (per-model gauges, histograms, errors) is there, and reads
/metrics: sample name -> label names. The families that exist only on a GPU
(rvd_engine_seconds_total, rvd_engine_events_total, rvd_engine_errors_total,
rvd_kernel_info) are therefore not in it, and deploy/ must not depend on them.

ALERT_METRICS are the two families issue 16 section 1 adds (rvd's own alert
rules). While this rvd does not export them yet, they are accepted from
this list alone; once it does, their labels must be the ones listed here.
"""
import pathlib
import subprocess
import sys
import time
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from promql import exposition  # noqa: E402

ALERT_METRICS = {
    "rvd_alert_active": {"model_id", "alert"},
    "rvd_alerts_fired_total": {"model_id", "alert"},
}


def pytest_configure(config):
    # pytest creates --basetemp without its parents (ctest passes
    # BUILD/pytest-tmp/deploy, and pytest-tmp exists only after another run).
    if config.option.basetemp:
        pathlib.Path(config.option.basetemp).resolve().parent.mkdir(parents=True, exist_ok=True)


def _request(rvd_pb2, model_id):
    tensors, data = [], []
    rng = np.random.default_rng(16)
    print("deploy conftest: numpy seed 16")
    for layer in range(4):
        w = rng.standard_normal((16, 64)).astype(np.float32)
        tensors.append(rvd_pb2.TensorSpec(
            name=f"model.layers.{layer}.self_attn.v_proj.weight", layer=layer,
            dtype=rvd_pb2.DTYPE_F32, shape=[16, 64],
            layout=rvd_pb2.V_LAYOUT_SEPARATE,
            geometry=rvd_pb2.HeadGeometry(num_heads=4, num_kv_heads=2, head_dim=8)))
        data.append(w.tobytes())
    header = rvd_pb2.MeasureHeader(model_id=model_id, step=1, tensors=tensors,
                                   per_head=True)
    return rvd_pb2.MeasureRequest(header=header, data=data)


def _wait_metrics(proc, address, log, timeout=20):
    """Polls /metrics until it answers (rvd serves gRPC before /metrics)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"rvd exited: {log.read_text()}")
        try:
            return urllib.request.urlopen(f"http://{address}/metrics", timeout=1).read()
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"rvd did not serve /metrics: {log.read_text()}")


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    # rvdtest's own Daemon waits for gRPC health through a channel opened
    # before rvd listens, which costs seconds of reconnect backoff; this
    # waits for the port first and only then opens the channel.
    import grpc
    from rvdtest import RVD, free_port, rvd_pb2, rvd_pb2_grpc

    tmp = tmp_path_factory.mktemp("rvd")
    grpc_address = f"127.0.0.1:{free_port()}"
    metrics_address = f"127.0.0.1:{free_port()}"
    config = tmp / "rvd.yaml"
    config.write_text(
        f'grpc_address: "{grpc_address}"\nmetrics_address: "{metrics_address}"\n'
        f'backend: cpu\ndata_dir: "{tmp / "data"}"\nengine_threads: 1\n'
        "per_head_metrics: true\nrv_alert_threshold: 0.5\n")
    (tmp / "data").mkdir()  # rvd refuses a data_dir that does not exist
    log = tmp / "rvd.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([str(RVD), "--config", str(config)],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_metrics(proc, metrics_address, log)
        with grpc.insecure_channel(grpc_address) as channel:
            stub = rvd_pb2_grpc.RvdStub(channel)
            stub.Measure(_request(rvd_pb2, "deploy-test"), timeout=30,
                         wait_for_ready=True)
            try:
                stub.Measure(_request(rvd_pb2, "not a valid id!"), timeout=30)
            except grpc.RpcError as e:  # what rvd_errors_total counts
                assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
            else:
                raise AssertionError("rvd accepted an invalid model id")
        text = urllib.request.urlopen(f"http://{metrics_address}/metrics",
                                      timeout=10).read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    names = {k: v for k, v in exposition(text).items() if k.startswith("rvd_")}
    # The families rvd must export for the test to mean anything.
    for must in ("rvd_rv", "rvd_participation_ratio",
                 "rvd_measurement_duration_seconds_bucket",
                 "rvd_errors_total", "rvd_ingested_bytes_total"):
        assert must in names, f"{must} missing from a real rvd's /metrics"
    for name, labels in ALERT_METRICS.items():
        if name in names:
            assert labels <= names[name], (
                f"rvd exports {name} with labels {sorted(names[name])}, "
                f"the deploy files expect {sorted(labels)}")
        else:
            names[name] = set(labels)
    return names


def rvd_accepts(configs, tmp):
    """Starts the built rvd once on each config text (loopback addresses,
    the CPU backend and a temporary data_dir given as flags on top, as a
    pod's would be its own) and waits until it serves /metrics; returns
    {name: error text} for every config it refused (exit 2 on a bad key or
    value) or that did not come up."""
    from rvdtest import RVD, free_port

    procs = {}
    for name, text in configs.items():
        path = tmp / f"{name}.yaml"
        path.write_text(text)
        metrics = f"127.0.0.1:{free_port()}"
        log = tmp / f"{name}.log"
        (tmp / f"{name}-data").mkdir()  # as a pod's emptyDir would be there
        with open(log, "w") as out:
            p = subprocess.Popen(
                [str(RVD), "--config", str(path),
                 "--grpc-address", f"127.0.0.1:{free_port()}",
                 "--metrics-address", metrics, "--backend", "cpu",
                 "--data-dir", str(tmp / f"{name}-data")],
                stdout=out, stderr=subprocess.STDOUT)
        procs[name] = (p, metrics, log)
    errors = {}
    for name, (p, metrics, log) in procs.items():
        try:
            _wait_metrics(p, metrics, log)
        except RuntimeError as e:
            errors[name] = str(e)
    for p, _, _ in procs.values():
        if p.poll() is None:
            p.terminate()
    for p, _, _ in procs.values():
        p.wait(timeout=20)
    return errors
