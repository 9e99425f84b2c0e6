"""The durable history (data_dir): kill -9 in the middle of a stream of
measurements from several clients loses nothing acknowledged; a damaged
store file is reported and replaced while rvd keeps serving; ranges,
export and deletion through rvctl."""
import csv
import datetime
import io
import json
import os
import random
import re
import signal
import threading
import time

import numpy as np
import pytest

from rvdtest import (RVD, TIME_SCALE, Daemon, grpc, metric, rvd_pb2, scrape,
                     spectrum_matrix)

SEED = int(os.environ.get("RVD_TEST_SEED", random.randrange(1 << 30)))
print(f"test_store: RVD_TEST_SEED={SEED}")


def request_for(model_id, step, rng, layers=4):
    arrays = [spectrum_matrix(rng, 16, 32, 0.3 + 0.2 * l) for l in range(layers)]
    tensors = [rvd_pb2.TensorSpec(
        name=f"layers.{l}.v_proj", layer=l, dtype=rvd_pb2.DTYPE_F32,
        shape=list(a.shape), layout=rvd_pb2.V_LAYOUT_SEPARATE,
        geometry=rvd_pb2.HeadGeometry(num_heads=2, num_kv_heads=2, head_dim=8))
        for l, a in enumerate(arrays)]
    header = rvd_pb2.MeasureHeader(model_id=model_id, step=step, tensors=tensors)
    return rvd_pb2.MeasureRequest(header=header, data=[a.tobytes() for a in arrays])


def all_stored(d, model_id):
    """Every stored measurement of a model, paging GetHistory's ranges."""
    out, after = [], 0
    while True:
        r = d.stub.GetHistory(rvd_pb2.GetHistoryRequest(
            model_id=model_id, after_sequence=after, limit=1000))
        out.extend(r.measurements)
        if not r.more:
            return out
        after = r.measurements[-1].sequence


def test_kill9_mid_stream_loses_nothing_acknowledged(tmp_path):
    data = tmp_path / "store"
    data.mkdir()
    d = Daemon(tmp_path, data_dir=str(data))
    clients = 4
    acked = {}     # (model, step) -> Measurement, answered OK
    failed = {}    # (model, step) -> code, answered with an error by rvd
    in_flight = {}  # model -> step sent when rvd died (its fate is unknown)
    lock = threading.Lock()
    enough = threading.Event()   # kill once this many are acknowledged
    stop = threading.Event()

    def client(i):
        rng = np.random.default_rng(SEED + i)
        model = f"kill-m{i}"
        step = 0
        while not stop.is_set():
            step += 1
            req = request_for(model, step, rng)
            if step % 5 == 0:
                req.header.variant.name = "no_such_variant"  # refused by rvd
            try:
                m = d.stub.Measure(req, timeout=10 * TIME_SCALE)
                with lock:
                    acked[(model, step)] = m
                    if len(acked) >= 60:
                        enough.set()
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    with lock:
                        failed[(model, step)] = e.code()
                    continue
                # rvd is gone: this one may or may not have been stored.
                with lock:
                    in_flight[model] = step
                return

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    assert enough.wait(60 * TIME_SCALE), "measurements too slow"
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait(10)
    stop.set()
    for t in threads:
        t.join(30)
    d.stop()
    assert d.proc.returncode == -signal.SIGKILL
    assert len(acked) >= 60 and failed

    d2 = Daemon(tmp_path, data_dir=str(data))
    try:
        log = d2.log_text()
        assert "history rebuilt from the store" in log, log
        stored = {}
        for i in range(clients):
            for m in all_stored(d2, f"kill-m{i}"):
                stored[(m.model_id, m.step)] = m
        # Every acknowledged measurement, as it was acknowledged.
        for key, m in acked.items():
            assert key in stored, f"acknowledged {key} seq {m.sequence} lost"
            s = stored[key]
            assert s.sequence == m.sequence and s.rv == m.rv
            assert [l.pr for l in s.layers] == [l.pr for l in m.layers]
        # None that rvd refused; beyond the acknowledged ones, at most the
        # one request per client that was in flight when rvd died.
        for key in failed:
            assert key not in stored, f"refused {key} was stored"
        extra = set(stored) - set(acked)
        print(f"kill -9: {len(acked)} acknowledged, {len(failed)} refused, "
              f"{len(in_flight)} in flight when rvd died, {len(extra)} of them stored")
        assert all(in_flight.get(model) == step for model, step in extra), extra
        # Numbering continues; the newest is what /metrics and GetLatest show.
        top = max(m.sequence for m in stored.values())
        text = scrape(d2)
        for i in range(clients):
            model = f"kill-m{i}"
            newest = max((m for m in stored.values() if m.model_id == model),
                         key=lambda m: m.sequence)
            latest = d2.stub.GetLatest(rvd_pb2.GetLatestRequest(model_id=model))
            assert latest.sequence == newest.sequence
            assert metric(text, "rvd_rv", model_id=model) == pytest.approx(newest.rv, rel=1e-12)
            assert metric(text, "rvd_participation_ratio", model_id=model,
                          layer="0") == pytest.approx(newest.layers[0].pr, rel=1e-12)
        assert metric(text, "rvd_store_rows") == len(stored)
        assert metric(text, "rvd_store_damaged") == 0
        after = d2.stub.Measure(request_for("kill-m0", 10**6, np.random.default_rng(SEED)))
        assert after.sequence == top + 1
    finally:
        assert d2.stop() == 0


def test_damaged_store_file_is_reported_and_rvd_keeps_serving(tmp_path):
    data = tmp_path / "store"
    data.mkdir()
    rng = np.random.default_rng(SEED)
    d = Daemon(tmp_path, data_dir=str(data))
    n = 300
    for step in range(1, n + 1):
        d.stub.Measure(request_for(f"dmg-{step % 3}", step, rng, layers=8))
    assert d.stop() == 0  # a clean stop checkpoints the WAL into rvd.db
    db = data / "rvd.db"
    assert not (data / "rvd.db-wal").exists()
    os.truncate(db, db.stat().st_size // 2)

    d2 = Daemon(tmp_path, data_dir=str(data))
    try:
        log = d2.log_text()
        m = re.search(r"store \S+ was damaged \((.*)\): moved to (\S+); (\d+) "
                      r"measurements recovered, (at most )?(\d+) lost", log)
        assert m, log
        recovered, lost = int(m.group(3)), int(m.group(5))
        assert 0 < recovered < n and recovered + lost == n, (recovered, lost)
        assert os.path.exists(m.group(2))
        text = scrape(d2)
        assert metric(text, "rvd_store_damaged") == 1
        assert metric(text, "rvd_store_lost_measurements") == lost
        assert metric(text, "rvd_store_recovered_measurements") == recovered
        kept = sum(len(all_stored(d2, f"dmg-{i}")) for i in range(3))
        assert kept == recovered
        # Serving: a new measurement is numbered after the damaged file's.
        new = d2.stub.Measure(request_for("dmg-0", 10**6, rng))
        assert new.sequence == n + 1
    finally:
        assert d2.stop() == 0
    # The replacement is a healthy store: a third start finds nothing wrong.
    d3 = Daemon(tmp_path, data_dir=str(data))
    try:
        assert "was damaged" not in d3.log_text()
        assert metric(scrape(d3), "rvd_store_damaged") == 0
        assert d3.stub.GetLatest(rvd_pb2.GetLatestRequest(model_id="dmg-0")).step == 10**6
    finally:
        assert d3.stop() == 0


def test_bad_data_dirs_fail_at_start_with_a_message(tmp_path):
    import subprocess
    def start(*args):
        return subprocess.run([str(RVD), "--backend", "cpu", "--grpc-address",
                               "127.0.0.1:0", "--metrics-address", "", *args],
                              capture_output=True, text=True, timeout=30)
    r = start("--data-dir", str(tmp_path / "missing"))
    assert r.returncode == 1 and "missing" in r.stderr and "No such file" in r.stderr, r
    (tmp_path / "file").write_text("x")
    r = start("--data-dir", str(tmp_path / "file"))
    assert r.returncode == 1 and "not a directory" in r.stderr, r
    r = start("--store-sync", "sometimes")
    assert r.returncode == 2 and "store_sync" in r.stderr, r
    # A store from a newer rvd: refused, and left as it was.
    import sqlite3
    data = tmp_path / "newer"
    data.mkdir()
    c = sqlite3.connect(data / "rvd.db")
    c.execute("PRAGMA user_version=7")
    c.execute("CREATE TABLE measurements(x)")
    c.commit()
    c.close()
    before = (data / "rvd.db").read_bytes()
    r = start("--data-dir", str(data))
    assert r.returncode == 1 and "schema version 7" in r.stderr, r
    assert (data / "rvd.db").read_bytes() == before


def test_rvctl_ranges_export_and_delete(tmp_path):
    data = tmp_path / "store"
    data.mkdir()
    rng = np.random.default_rng(SEED)
    # A ring of 5 per model, 1200 on disk: ranges and exports read the disk.
    d = Daemon(tmp_path, data_dir=str(data), history_capacity=5,
               store_sync="20ms")
    try:
        for step in range(0, 1200):
            d.stub.Measure(request_for("rng", step, rng, layers=2))
        d.stub.Measure(request_for("other", 1, rng, layers=2))
        # An old client (no range fields) still gets the ring.
        r = d.stub.GetHistory(rvd_pb2.GetHistoryRequest(model_id="rng"))
        assert [m.step for m in r.measurements] == [1195, 1196, 1197, 1198, 1199]
        out = d.rvctl("history", "rng", "--from-step", 100, "--to-step", 104).stdout
        assert [int(re.search(r"step (\d+)", l).group(1)) for l in out.splitlines()] \
            == [100, 101, 102, 103, 104]
        # Full export, more than one page, JSON and CSV alike.
        js = json.loads(d.rvctl("history", "rng", "--format", "json").stdout)
        assert [m["step"] for m in js] == list(range(1200))
        rows = list(csv.DictReader(io.StringIO(
            d.rvctl("history", "rng", "--format", "csv").stdout)))
        assert [int(r["step"]) for r in rows] == list(range(1200))
        assert rows[7]["layer_pr"].startswith("0:") and float(rows[7]["rv"]) == js[7]["rv"]
        # Time ranges, split at the exact timestamp (RFC 3339 with
        # nanoseconds) of the measurement in the middle: all 1200 may fall
        # within one second on a fast machine.
        mid = d.stub.GetHistory(rvd_pb2.GetHistoryRequest(
            model_id="rng", from_step=600, to_step=600)).measurements[0]
        since = (datetime.datetime.fromtimestamp(mid.timestamp.seconds, datetime.timezone.utc)
                 .strftime("%Y-%m-%dT%H:%M:%S") + f".{mid.timestamp.nanos:09d}Z")
        later = json.loads(d.rvctl("history", "rng", "--format", "json",
                                   "--since", since).stdout)
        earlier = json.loads(d.rvctl("history", "rng", "--format", "json",
                                     "--until", since).stdout)
        assert len(later) + len(earlier) == 1200 and later and earlier
        assert max(m["step"] for m in earlier) < min(m["step"] for m in later) == 600
        # Unix seconds work too: a bound past every measurement keeps them all.
        every = json.loads(d.rvctl("history", "rng", "--format", "json",
                                   "--until", mid.timestamp.seconds + 3600).stdout)
        assert len(every) == 1200
        assert d.rvctl("history", "rng", "--since", "yesterday", check=False).returncode == 2
        # Delete: gone from disk, the ring and /metrics; other models stay.
        assert "deleted 1200 measurements" in d.rvctl("delete", "rng").stdout
        assert d.rvctl("history", "rng", "--format", "json", check=False).returncode == 1
        assert metric(scrape(d), "rvd_rv", model_id="rng") is None
        assert metric(scrape(d), "rvd_rv", model_id="other") is not None
        assert d.rvctl("delete", "rng", check=False).returncode == 1
    finally:
        assert d.stop() == 0
    d2 = Daemon(tmp_path, data_dir=str(data), history_capacity=5)
    try:
        models = [m.model_id for m in d2.stub.ListModels(rvd_pb2.ListModelsRequest()).models]
        assert models == ["other"]
    finally:
        assert d2.stop() == 0


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs (needs root and mount(2); skipped otherwise)."""
    import subprocess
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
            capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs (not root, or no mount(2) here)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_fails_the_measurement_and_loses_nothing_acknowledged(tmp_path, small_disk):
    data = small_disk / "store"
    data.mkdir()
    d = Daemon(tmp_path, data_dir=str(data))
    rng = np.random.default_rng(SEED)
    try:
        # Leave rvd a few hundred KiB: the filler is freed later.
        filler = small_disk / "filler"
        filler.write_bytes(b"\0" * (1536 << 10))
        acked, refused = [], None
        for step in range(1, 5000):
            req = request_for("full", step, rng, layers=16)
            req.header.per_head = True
            try:
                acked.append(d.stub.Measure(req, timeout=10 * TIME_SCALE))
            except grpc.RpcError as e:
                refused = (step, e)
                break
        assert refused is not None, "the disk never filled"
        step, e = refused
        print(f"full disk: {len(acked)} stored, then {e.code()}: {e.details()}")
        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
        assert "disk holding data_dir is full" in e.details()
        # Nothing of the refused one is visible; what was acknowledged is.
        latest = d.stub.GetLatest(rvd_pb2.GetLatestRequest(model_id="full"))
        assert latest.step == acked[-1].step and latest.sequence == acked[-1].sequence
        assert metric(scrape(d), "rvd_store_append_errors_total", reason="disk_full") >= 1
        # Space again: rvd stores again, numbering with no hole.
        filler.unlink()
        again = d.stub.Measure(request_for("full", step, rng))
        assert again.sequence == acked[-1].sequence + 1
    finally:
        assert d.stop() == 0
    d2 = Daemon(tmp_path, data_dir=str(data))
    try:
        stored = all_stored(d2, "full")
        assert [m.sequence for m in stored] == [m.sequence for m in acked] + [again.sequence]
    finally:
        assert d2.stop() == 0


def test_delete_gives_the_series_budget_back(tmp_path):
    # In memory (no data_dir): deletion works there too. A budget of two
    # per-layer series: one model of two layers at a time.
    d = Daemon(tmp_path, max_metric_series=2)
    rng = np.random.default_rng(SEED)
    try:
        d.stub.Measure(request_for("first", 1, rng, layers=2))
        assert metric(scrape(d), "rvd_participation_ratio", model_id="first", layer="1") is not None
        assert d.stub.DeleteModelHistory(
            rvd_pb2.DeleteModelHistoryRequest(model_id="first")).deleted == 1
        d.stub.Measure(request_for("second", 1, rng, layers=2))
        text = scrape(d)
        assert metric(text, "rvd_participation_ratio", model_id="second", layer="1") is not None
        assert metric(text, "rvd_rv", model_id="first") is None
        assert metric(text, "rvd_series_dropped_total") == 0
        with pytest.raises(grpc.RpcError) as e:
            d.stub.GetHistory(rvd_pb2.GetHistoryRequest(model_id="first"))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        assert d.stop() == 0
