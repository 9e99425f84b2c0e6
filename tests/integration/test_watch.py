"""Sequence numbers, WatchMeasurements (resume cursor, gap events, the
watcher bound, shutdown with watchers attached) and the metrics that
describe them, against the real rvd."""
import json
import signal
import subprocess
import threading
import time

import grpc
import numpy as np
import pytest

from rvdtest import RVCTL, TIME_SCALE, Daemon, rvd_pb2, scrape


def request(model_id, step=0, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((16, 32)).astype(np.float32)
    spec = rvd_pb2.TensorSpec(
        name="model.layers.0.self_attn.v_proj.weight", layer=0,
        dtype=rvd_pb2.DTYPE_F32, shape=[16, 32], layout=rvd_pb2.V_LAYOUT_SEPARATE,
        geometry=rvd_pb2.HeadGeometry(num_heads=2, num_kv_heads=2, head_dim=8))
    return rvd_pb2.MeasureRequest(
        header=rvd_pb2.MeasureHeader(model_id=model_id, step=step, tensors=[spec]),
        data=[a.tobytes()])


def measure(d, model_id, step=0):
    return d.stub.Measure(request(model_id, step, seed=step))


def sample(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


class Watcher:
    """A WatchMeasurements stream read on a thread: events and the final status."""

    def __init__(self, d, model_id="", after=None):
        req = rvd_pb2.WatchRequest(model_id=model_id)
        if after is not None:
            req.after_sequence = after
        self.call = d.stub.WatchMeasurements(req)
        self.events, self.code, self.details = [], None, None
        self.ended = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        try:
            for e in self.call:
                self.events.append(e)
        except grpc.RpcError as e:
            self.code, self.details = e.code(), e.details()
        else:
            self.code = grpc.StatusCode.OK
        self.ended.set()

    def sequences(self):
        return [e.measurement.sequence for e in self.events if e.HasField("measurement")]

    def wait_for(self, n, timeout=10):
        deadline = time.time() + timeout
        while len(self.events) < n and time.time() < deadline:
            time.sleep(0.01)
        return len(self.events) >= n


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    daemon = Daemon(tmp_path_factory.mktemp("watch"), max_watchers=3)
    yield daemon
    assert daemon.stop() == 0


def test_sequence_numbers_increase_over_all_models(d):
    seqs = [measure(d, m).sequence for m in ("s-a", "s-b", "s-a")]
    assert seqs[0] > 0 and seqs == [seqs[0], seqs[0] + 1, seqs[0] + 2]
    history = d.stub.GetHistory(rvd_pb2.GetHistoryRequest(model_id="s-a")).measurements
    assert [m.sequence for m in history] == [seqs[0], seqs[2]]
    assert d.stub.GetLatest(rvd_pb2.GetLatestRequest(model_id="s-b")).sequence == seqs[1]
    assert f"seq={seqs[2]}" in d.log_text()


def test_resume_cursor_replays_then_goes_live(d):
    first = measure(d, "r-a", 1).sequence
    measure(d, "r-b", 2)
    measure(d, "r-a", 3)
    w = Watcher(d, "r-a", after=first)  # r-a after `first`: step 3, then live
    assert w.wait_for(1)
    live = measure(d, "r-a", 4).sequence
    assert w.wait_for(2)
    w.call.cancel()
    assert w.ended.wait(5)
    got = [(e.measurement.step, e.measurement.sequence) for e in w.events]
    assert got == [(3, first + 2), (4, live)]
    # after_sequence 0: everything retained, oldest first, no duplicates.
    w0 = Watcher(d, "", after=0)
    assert w0.wait_for(live)  # this module's daemon has stored `live` so far
    w0.call.cancel()
    assert w0.sequences()[:live] == list(range(1, live + 1))


def test_cursor_above_the_newest_is_out_of_range(d):
    last = measure(d, "oor").sequence
    w = Watcher(d, "", after=last + 1000)
    assert w.ended.wait(5)
    assert w.code == grpc.StatusCode.OUT_OF_RANGE
    assert "after_sequence" in w.details


def test_bad_model_id_is_invalid_argument(d):
    w = Watcher(d, "not valid!")
    assert w.ended.wait(5)
    assert w.code == grpc.StatusCode.INVALID_ARGUMENT


def test_watchers_beyond_max_watchers_are_refused(d):
    ws = [Watcher(d, "") for _ in range(3)]
    try:
        # Each stream is open once its initial metadata arrived.
        for w in ws:
            w.call.initial_metadata()
        assert sample(scrape(d), "rvd_watchers") == 3
        extra = Watcher(d, "")
        assert extra.ended.wait(5)
        assert extra.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_watchers" in extra.details
    finally:
        for w in ws:
            w.call.cancel()
    deadline = time.time() + 5
    while sample(scrape(d), "rvd_watchers") != 0 and time.time() < deadline:
        time.sleep(0.05)
    assert sample(scrape(d), "rvd_watchers") == 0
    again = Watcher(d, "")
    again.call.initial_metadata()
    again.call.cancel()


def test_rvctl_watch_after_prints_sequences(d, tmp_path):
    first = measure(d, "ctl", 1).sequence
    measure(d, "ctl", 2)
    p = subprocess.Popen([str(RVCTL), "--address", d.grpc_address, "watch", "ctl",
                          "--after", str(first - 1), "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = [json.loads(p.stdout.readline()) for _ in range(2)]
    finally:
        p.kill()
        p.wait()
    assert [(l["step"], l["sequence"]) for l in lines] == [(1, first), (2, first + 1)]
    r = d.rvctl("history", "ctl", "--csv")
    assert r.stdout.splitlines()[0].endswith(",sequence")
    assert r.stdout.splitlines()[1].endswith(f",{first}")


def test_request_metrics(d):
    measure(d, "req")
    try:
        d.stub.GetLatest(rvd_pb2.GetLatestRequest(model_id="never-measured"))
    except grpc.RpcError:
        pass
    text = scrape(d)
    assert 'rvd_request_duration_seconds_count{code="OK",method="Measure"}' in text
    assert 'rvd_request_duration_seconds_count{code="NOT_FOUND",method="GetLatest"}' in text
    # Watch streams that ended are observed too (cancelled above).
    assert 'method="WatchMeasurements"' in text
    assert sample(text, "rvd_inflight_requests") == 0
    assert sample(text, "rvd_watch_gap_entries_total") == 0
    p = subprocess.run(["promtool", "check", "metrics"], input=text,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_sigterm_with_watchers_attached_ends_their_streams(tmp_path):
    d = Daemon(tmp_path)
    watchers = [Watcher(d, ""), Watcher(d, "x"), Watcher(d, "", after=0)]
    for w in watchers:
        w.call.initial_metadata()
    seq = measure(d, "x").sequence
    assert all(w.wait_for(1) for w in watchers)
    ctl = subprocess.Popen([str(RVCTL), "--address", d.grpc_address, "watch"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)  # rvctl attached
    start = time.time()
    d.proc.send_signal(signal.SIGTERM)
    for w in watchers:
        assert w.ended.wait(3), "a watch stream did not end on SIGTERM"
        assert w.code == grpc.StatusCode.UNAVAILABLE, (w.code, w.details)
        assert f"after_sequence {seq}" in w.details
    assert time.time() - start < 3
    out, err = ctl.communicate(timeout=5)
    assert ctl.returncode == 1 and "UNAVAILABLE" in err and "shutting down" in err, err
    assert d.proc.wait(timeout=8) == 0
    assert time.time() - start < 5 * TIME_SCALE  # within the shutdown grace
    d.log.close()
