"""Checkpoints rvd reads itself, against the real rvd: the watch section (a
checkpoint written in pieces is measured once, with its step, and not again
after a restart), MeasurePath and its refusals, and rvctl's choice between
MeasurePath and streaming."""
import json
import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request

import grpc
import numpy as np
import pytest

import rvdtest
from rvdtest import RVCTL, RVD, TIME_SCALE, Daemon, pr_oracle, rvd_pb2, write_llama

SETTLE = 0.6  # settle_seconds of the watching daemons
POLL = 0.3    # poll_interval_seconds


def history(d, model_id):
    try:
        return list(d.stub.GetHistory(rvd_pb2.GetHistoryRequest(model_id=model_id)).measurements)
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.NOT_FOUND, e
        return []


def wait_for(cond, timeout):
    deadline = time.time() + timeout * TIME_SCALE
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def watch_config(runs, inotify, data_dir):
    return {"checkpoint_roots": [str(runs.parent)], "data_dir": str(data_dir),
            "watch": {"directories": [{"path": f"{runs}/*", "model_id": "{dir}"}],
                      "poll_interval_seconds": POLL, "settle_seconds": SETTLE,
                      "inotify": inotify}}


@pytest.mark.parametrize("inotify", [True, False], ids=["inotify", "polling"])
def test_checkpoint_written_in_pieces_is_measured_once_and_not_after_restart(tmp_path, inotify):
    rng = np.random.default_rng(1200)
    print("seed 1200")
    stage = tmp_path / "stage"
    vs = write_llama(stage, rng, layers=8, shards=2)
    runs = tmp_path / "ckpt" / "runs"
    run = runs / "llama-a"
    run.mkdir(parents=True)
    (tmp_path / "data").mkdir()
    cfg = watch_config(runs, inotify, tmp_path / "data")
    d = Daemon(tmp_path, **cfg)
    try:
        # Names that are no checkpoints, complete or not, are never read.
        shutil.copytree(stage, run / "tmp-checkpoint-1300")
        shutil.copytree(stage, run / "logs")
        ckpt = run / "checkpoint-1200"
        ckpt.mkdir()
        pause = 2 * SETTLE + POLL
        (ckpt / "config.json").write_bytes((stage / "config.json").read_bytes())
        time.sleep(pause)
        shards = sorted(p.name for p in stage.glob("model-*.safetensors"))
        (ckpt / shards[0]).write_bytes((stage / shards[0]).read_bytes())
        (ckpt / "model.safetensors.index.json").write_bytes(
            (stage / "model.safetensors.index.json").read_bytes())
        time.sleep(pause)  # the index names a shard not there yet
        second = (stage / shards[1]).read_bytes()
        with open(ckpt / shards[1], "wb") as f:
            f.write(second[: len(second) // 2])
        time.sleep(pause)  # half a shard, settled: the loader refuses it
        assert history(d, "llama-a") == [], "a checkpoint still being written was measured"
        with open(ckpt / shards[1], "ab") as f:
            f.write(second[len(second) // 2:])
        assert wait_for(lambda: len(history(d, "llama-a")) > 0, 15), d.log_text()
        time.sleep(3 * SETTLE + 2 * POLL)
        ms = history(d, "llama-a")
        assert len(ms) == 1, [m.step for m in ms]
        m = ms[0]
        assert m.step == 1200
        assert [l.layer for l in m.layers] == list(range(8))
        for l in m.layers:
            ref = pr_oracle(vs[l.layer])
            assert abs(l.pr - ref) <= 1e-4 * ref, (l.layer, l.pr, ref)
        log = d.log_text()
        assert "watch: measured" in log and "checkpoint-1200" in log
        assert log.count("watch: measured") == 1
        metrics = urllib.request.urlopen(f"http://{d.metrics_address}/metrics",
                                         timeout=5).read().decode()
        assert "rvd_checkpoint_watch_measured_total 1" in metrics
        assert "rvd_checkpoint_watch_directories 1" in metrics
        assert "rvd_checkpoint_watch_pending 0" in metrics
    finally:
        d.stop()

    # A restart with the same data_dir does not measure it again; a new
    # checkpoint is measured.
    d = Daemon(tmp_path, **cfg)
    try:
        assert wait_for(lambda: "not measured again" in d.log_text(), 10), d.log_text()
        time.sleep(2 * SETTLE + 2 * POLL)
        assert "watch: measured" not in d.log_text()
        assert len([m for m in history(d, "llama-a") if m.step == 1200]) <= 1
        shutil.copytree(stage, run / "global_step1400")
        assert wait_for(lambda: any(m.step == 1400 for m in history(d, "llama-a")), 15), \
            d.log_text()
        assert d.log_text().count("watch: measured") == 1
    finally:
        d.stop()


def test_a_watch_directory_that_does_not_exist_stops_the_start(tmp_path):
    root = tmp_path / "ckpt"
    root.mkdir()
    cfg = tmp_path / "rvd.yaml"
    cfg.write_text(json.dumps({
        "grpc_address": f"127.0.0.1:{rvdtest.free_port()}", "metrics_address": "",
        "backend": "cpu", "data_dir": "", "checkpoint_roots": [str(root)],
        "watch": {"directories": [f"{root}/missing/*"]}}))
    r = subprocess.run([str(RVD), "--config", str(cfg)], capture_output=True, text=True,
                       timeout=30 * TIME_SCALE)
    assert r.returncode != 0
    assert f"{root}/missing" in r.stderr and "does not exist" in r.stderr, r.stderr
    # A watch directory outside the roots is a configuration error (exit 2).
    cfg.write_text(json.dumps({"checkpoint_roots": [str(root)],
                               "watch": {"directories": [str(tmp_path)]}}))
    r = subprocess.run([str(RVD), "--config", str(cfg)], capture_output=True, text=True,
                       timeout=30 * TIME_SCALE)
    assert r.returncode == 2, r.stderr
    assert "checkpoint_roots" in r.stderr


def path_request(path, model_id="m", **kw):
    return rvd_pb2.MeasurePathRequest(
        path=str(path), header=rvd_pb2.MeasureHeader(model_id=model_id, step=5), **kw)


def code_of(d, req):
    try:
        d.stub.MeasurePath(req, timeout=10 * TIME_SCALE)
    except grpc.RpcError as e:
        return e.code(), e.details()
    return grpc.StatusCode.OK, ""


@pytest.fixture
def tree(tmp_path):
    """<tmp>/root (the root) with good and hostile checkpoints, <tmp>/outside."""
    rng = np.random.default_rng(7)
    print("seed 7")
    root, outside = tmp_path / "root", tmp_path / "outside"
    vs = write_llama(root / "good", rng, layers=4, shards=2)
    write_llama(outside / "ckpt", rng, layers=4, shards=2)
    (root / "escape").symlink_to(outside / "ckpt")
    shard = sorted((root / "good").glob("model-*.safetensors"))[1].name
    shutil.copytree(root / "good", root / "shard-escape")
    (root / "shard-escape" / shard).unlink()
    (root / "shard-escape" / shard).symlink_to(outside / "ckpt" / shard)
    write_llama(root / "fifo", rng, layers=4)
    (root / "fifo" / "model.safetensors").unlink()
    os.mkfifo(root / "fifo" / "model.safetensors")
    return root, outside, vs


def test_measure_path_reads_under_the_roots_and_refuses_the_rest(tmp_path, tree):
    root, outside, vs = tree
    d = Daemon(tmp_path, checkpoint_roots=[str(root)])
    try:
        m = d.stub.MeasurePath(path_request(root / "good"))
        assert m.step == 5 and len(m.layers) == 4
        for l in m.layers:
            ref = pr_oracle(vs[l.layer])
            assert abs(l.pr - ref) <= 1e-4 * ref
        cases = [
            (outside / "ckpt", grpc.StatusCode.PERMISSION_DENIED),
            (f"{root}/../outside/ckpt", grpc.StatusCode.PERMISSION_DENIED),
            (root / "escape", grpc.StatusCode.PERMISSION_DENIED),
            (root / "shard-escape", grpc.StatusCode.PERMISSION_DENIED),
            (root / "fifo", grpc.StatusCode.INVALID_ARGUMENT),
            ("good", grpc.StatusCode.INVALID_ARGUMENT),
            (root / "missing", grpc.StatusCode.NOT_FOUND),
        ]
        for path, want in cases:
            t0 = time.time()
            code, details = code_of(d, path_request(path))
            assert code == want, (path, code, details)
            assert time.time() - t0 < 5 * TIME_SCALE, path  # a FIFO must not block
        # A header that lists tensors is refused: rvd finds them itself.
        req = path_request(root / "good")
        req.header.tensors.add(name="x")
        assert code_of(d, req)[0] == grpc.StatusCode.INVALID_ARGUMENT
        log = d.log_text()
        assert log.count("MeasurePath: refused to read") >= len(cases)
        assert f"to {outside}/ckpt" in log  # the log says where a symlink led
        # Nothing refused was recorded.
        assert len(history(d, "m")) == 1
    finally:
        d.stop()


def test_without_roots_measure_path_is_failed_precondition(tmp_path, tree):
    root, _, _ = tree
    d = Daemon(tmp_path)
    try:
        code, details = code_of(d, path_request(root / "good"))
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert "checkpoint_roots" in details
    finally:
        d.stop()


def test_rvctl_uses_measure_path_when_rvd_sees_the_path_and_streams_otherwise(tmp_path, tree):
    root, outside, _ = tree
    d = Daemon(tmp_path, checkpoint_roots=[str(root)])
    try:
        def run(path, *extra, check=True):
            return d.rvctl("measure", path, "--model-id", "r", "--json", *extra, check=check)
        by_path = json.loads(run(root / "good").stdout)
        assert by_path["transfer"] == "path"
        assert by_path["client_load_ms"] == 0
        streamed = json.loads(run(root / "good", "--transfer", "stream").stdout)
        assert streamed["transfer"] == "stream" and "transfer_fallback" not in streamed
        # The same bytes, the same engine: the same PRs.
        assert by_path["per_layer_pr"] == streamed["per_layer_pr"]
        # Outside the roots: rvd refuses, rvctl streams and says why.
        fallback = json.loads(run(outside / "ckpt").stdout)
        assert fallback["transfer"] == "stream"
        assert fallback["transfer_fallback"].startswith("PERMISSION_DENIED")
        text = d.rvctl("measure", outside / "ckpt", "--model-id", "r").stdout
        assert "transfer: streamed" in text and "PERMISSION_DENIED" in text
        text = d.rvctl("measure", root / "good", "--model-id", "r").stdout
        assert "transfer: rvd read" in text
        # --transfer path insists.
        r = run(outside / "ckpt", "--transfer", "path", check=False)
        assert r.returncode == 1 and "PERMISSION_DENIED" in r.stderr
    finally:
        d.stop()


def test_files_rvd_may_not_read_are_permission_denied(tmp_path):
    """rvd runs as nobody here when the test runs as root (root reads any file)."""
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("needs setpriv to run rvd unprivileged")
    base = pathlib.Path(tempfile.mkdtemp(prefix="rvd-unreadable-"))
    try:
        os.chmod(base, 0o755)
        (base / "data").mkdir(mode=0o777)
        os.chmod(base / "data", 0o777)
        rng = np.random.default_rng(11)
        print("seed 11")
        root = base / "root"
        write_llama(root / "good", rng, layers=4, shards=2)
        shutil.copytree(root / "good", root / "unreadable")
        shard = sorted((root / "unreadable").glob("model-*.safetensors"))[0]
        os.chmod(shard, 0o200)
        shutil.copytree(root / "good", root / "closed" / "ckpt")
        os.chmod(root / "closed", 0o700)
        for p in [root, *root.rglob("*")]:
            if p.is_dir() and p != root / "closed":
                os.chmod(p, 0o755)
            elif p.is_file() and p != shard:
                os.chmod(p, 0o644)
        wrapper = base / "rvd-as-nobody"
        if os.geteuid() == 0:
            wrapper.write_text("#!/bin/sh\nexec setpriv --reuid=65534 --regid=65534 "
                               f"--clear-groups {RVD} \"$@\"\n")
        else:
            wrapper.write_text(f"#!/bin/sh\nexec {RVD} \"$@\"\n")
        os.chmod(wrapper, 0o755)
        old = rvdtest.RVD
        rvdtest.RVD = wrapper
        try:
            d = Daemon(base, checkpoint_roots=[str(root)])
        finally:
            rvdtest.RVD = old
        try:
            assert code_of(d, path_request(root / "good"))[0] == grpc.StatusCode.OK
            code, details = code_of(d, path_request(root / "unreadable"))
            assert code == grpc.StatusCode.PERMISSION_DENIED, details
            assert "not readable" in details
            code, details = code_of(d, path_request(root / "closed" / "ckpt"))
            assert code == grpc.StatusCode.PERMISSION_DENIED, details
            assert "refused to read" in d.log_text()
        finally:
            d.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)
