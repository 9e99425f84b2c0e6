"""Alert rules against the real rvd: a measurement sequence fires and
resolves an alert, seen through WatchAlerts, /metrics and rvctl watch; the
global rv_alert_threshold is one rule of the same kind; SIGHUP reloads a good
rules file and refuses a bad one (the old rules stay); a bad file stops rvd
at start with the reason."""
import json
import signal
import subprocess
import threading
import time

import grpc
import numpy as np
import pytest

from rvdtest import Daemon, RVCTL, RVD, TIME_SCALE, rvd_pb2, scrape

RULES = """\
rules:
  - name: rv_floor
    model: "alert-*"
    value: rv
    below: 0.5
    for: 2
    hysteresis: 0.1
    severity: critical
    labels: {team: ml}
    annotations: {summary: "R_V collapsed"}
"""


def layer(rank, seed):
    """16x32 f32 with `rank` equal singular values: PR exactly `rank`."""
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((16, 16)))
    v, _ = np.linalg.qr(rng.standard_normal((32, 16)))
    s = np.zeros(16)
    s[:rank] = 1.0
    return ((u * s) @ v.T).astype(np.float32)


def measure(d, model_id, late_rank, step):
    """Two layers, early [0] of PR 16 and late [1] of PR late_rank: R_V =
    late_rank / 16."""
    specs, data = [], []
    for l, rank in enumerate([16, late_rank]):
        specs.append(rvd_pb2.TensorSpec(
            name=f"model.layers.{l}.self_attn.v_proj.weight", layer=l,
            dtype=rvd_pb2.DTYPE_F32, shape=[16, 32],
            layout=rvd_pb2.V_LAYOUT_SEPARATE,
            geometry=rvd_pb2.HeadGeometry(num_heads=2, num_kv_heads=2, head_dim=8)))
        data.append(layer(rank, seed=step * 10 + l).tobytes())
    m = d.stub.Measure(rvd_pb2.MeasureRequest(
        header=rvd_pb2.MeasureHeader(model_id=model_id, step=step, tensors=specs,
                                     early_layers=[0], late_layers=[1]),
        data=data))
    assert m.rv == pytest.approx(late_rank / 16, rel=1e-4)
    return m


def sample(text, name, **labels):
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    prefix = f"{name}{{{want}}} " if labels else f"{name} "
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line.split()[-1])
    return None


class AlertWatcher:
    """A WatchAlerts stream read on a thread."""

    def __init__(self, d, model_id="", after=None):
        req = rvd_pb2.WatchAlertsRequest(model_id=model_id)
        if after is not None:
            req.after_sequence = after
        self.call = d.stub.WatchAlerts(req)
        self.events, self.code, self.details = [], None, None
        self.ended = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        # rvd sends the initial metadata once the watch is subscribed (or
        # the stream has ended): nothing logged after this is missed.
        self.call.initial_metadata()

    def _read(self):
        try:
            for e in self.call:
                self.events.append(e)
        except grpc.RpcError as e:
            self.code, self.details = e.code(), e.details()
        self.ended.set()

    def alerts(self):
        return [e.alert for e in self.events if e.HasField("alert")]

    def wait_for(self, n, timeout=10):
        deadline = time.time() + timeout * TIME_SCALE
        while len(self.alerts()) < n and time.time() < deadline:
            time.sleep(0.01)
        return self.alerts()


def wait_log(d, text, timeout=10):
    deadline = time.time() + timeout * TIME_SCALE
    while time.time() < deadline:
        if text in d.log_text():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("alerts")
    rules = tmp / "alert_rules.yaml"
    rules.write_text(RULES)
    daemon = Daemon(tmp, alert_rules_file=str(rules), rv_alert_threshold=0.3)
    daemon.rules_path = rules
    yield daemon
    daemon.stop()


def test_sequence_fires_and_resolves(d):
    w = AlertWatcher(d, model_id="alert-a")
    time.sleep(0.2)  # the stream is open
    before = scrape(d)
    assert sample(before, "rvd_alert_rules") == 2  # the file's and the threshold's
    measure(d, "alert-a", 12, 1)  # R_V 0.75
    m2 = measure(d, "alert-a", 6, 2)  # 0.375: pending (for: 2)
    assert [a.state for a in w.wait_for(1)] == [rvd_pb2.ALERT_STATE_PENDING]
    text = scrape(d)
    assert sample(text, "rvd_alert_active", alert="rv_floor", model_id="alert-a") == 0
    m3 = measure(d, "alert-a", 6, 3)  # firing
    events = w.wait_for(2)
    assert [a.state for a in events] == [rvd_pb2.ALERT_STATE_PENDING,
                                         rvd_pb2.ALERT_STATE_FIRING]
    pending, firing = events
    assert pending.measurement_sequence == m2.sequence
    assert firing.measurement_sequence == m3.sequence and firing.step == 3
    assert firing.alert == "rv_floor" and firing.model_id == "alert-a"
    assert firing.previous_state == rvd_pb2.ALERT_STATE_PENDING
    assert firing.value == pytest.approx(0.375, rel=1e-4)
    assert firing.threshold == 0.5
    assert firing.severity == "critical"
    assert dict(firing.labels) == {"team": "ml"}
    assert dict(firing.annotations) == {"summary": "R_V collapsed"}
    assert firing.since.seconds == m3.timestamp.seconds
    assert firing.sequence == pending.sequence + 1
    text = scrape(d)
    assert sample(text, "rvd_alert_active", alert="rv_floor", model_id="alert-a") == 1
    assert sample(text, "rvd_alerts_fired_total", alert="rv_floor", model_id="alert-a") == 1
    # 0.5625 is above 0.5 but inside the hysteresis (0.6): still firing.
    measure(d, "alert-a", 9, 4)
    measure(d, "alert-a", 12, 5)  # 0.75: resolved
    events = w.wait_for(3)
    assert [a.state for a in events][2:] == [rvd_pb2.ALERT_STATE_RESOLVED]
    assert events[2].value == pytest.approx(0.75, rel=1e-4)
    text = scrape(d)
    assert sample(text, "rvd_alert_active", alert="rv_floor", model_id="alert-a") == 0
    assert sample(text, "rvd_alerts_fired_total", alert="rv_floor", model_id="alert-a") == 1
    assert "alert firing alert=rv_floor model=alert-a" in d.log_text()
    assert "alert resolved alert=rv_floor model=alert-a" in d.log_text()
    # A stream resumed from 0 replays the retained events of its model.
    r = AlertWatcher(d, model_id="alert-a", after=0)
    assert [a.sequence for a in r.wait_for(3)] == [a.sequence for a in events]
    # A cursor above the newest event is refused.
    bad = AlertWatcher(d, after=10**9)
    assert bad.ended.wait(5) and bad.code == grpc.StatusCode.OUT_OF_RANGE


def test_global_threshold_is_a_rule(d):
    w = AlertWatcher(d, model_id="thr")
    time.sleep(0.2)
    measure(d, "thr", 4, 1)  # R_V 0.25 < rv_alert_threshold 0.3: fires at once
    events = w.wait_for(1)
    assert [(a.alert, a.state) for a in events] == [
        ("rv_alert_threshold", rvd_pb2.ALERT_STATE_FIRING)]
    text = scrape(d)
    assert sample(text, "rvd_alert_active", alert="rv_alert_threshold", model_id="thr") == 1
    assert sample(text, "rvd_rv_below_threshold", model_id="thr") == 1  # as before
    # "thr" does not match the file's glob "alert-*".
    assert sample(text, "rvd_alert_active", alert="rv_floor", model_id="thr") is None


def test_rvctl_watch_shows_measurements_and_alerts(d):
    p = subprocess.Popen([str(RVCTL), "--address", d.grpc_address, "watch", "alert-c",
                          "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        time.sleep(0.5 * TIME_SCALE)  # both of rvctl's streams open
        measure(d, "alert-c", 2, 1)  # R_V 0.125: threshold fires, rv_floor pending
        lines = [json.loads(p.stdout.readline()) for _ in range(3)]
    finally:
        p.kill()
        p.wait()
    kinds = sorted("alert" if "alert" in l else "measurement" for l in lines)
    assert kinds == ["alert", "alert", "measurement"], lines
    alerts = {l["alert"]["alert"]: l["alert"]["state"] for l in lines if "alert" in l}
    assert alerts == {"rv_alert_threshold": "firing", "rv_floor": "pending"}


def test_sighup_reloads_a_good_file_and_refuses_a_bad_one(d):
    w = AlertWatcher(d, model_id="alert-h")
    time.sleep(0.2)
    measure(d, "alert-h", 6, 1)  # rv_floor pending
    assert [a.state for a in w.wait_for(1)] == [rvd_pb2.ALERT_STATE_PENDING]
    # A good file: rv_floor changed (its pending pair closes), a new rule.
    d.rules_path.write_text(RULES.replace("below: 0.5", "below: 0.8") + """\
  - name: layer1_low
    model: "alert-h"
    value: layer_pr
    layer: 1
    below: 8
""")
    d.proc.send_signal(signal.SIGHUP)
    assert wait_log(d, "alert rules reloaded (3 rules)"), d.log_text()
    events = w.wait_for(2)
    assert events[1].state == rvd_pb2.ALERT_STATE_INACTIVE
    assert "removed or changed by a reload" in events[1].description
    assert sample(scrape(d), "rvd_alert_rules") == 3
    measure(d, "alert-h", 12, 2)  # 0.75 < 0.8 (pending); layer 1 PR 12 >= 8
    measure(d, "alert-h", 4, 3)   # firing, and layer 1 PR 4 < 8 fires
    states = {(a.alert, a.state) for a in w.wait_for(6)[2:]}
    assert states == {("rv_floor", rvd_pb2.ALERT_STATE_PENDING),
                      ("rv_floor", rvd_pb2.ALERT_STATE_FIRING),
                      ("layer1_low", rvd_pb2.ALERT_STATE_FIRING),
                      ("rv_alert_threshold", rvd_pb2.ALERT_STATE_FIRING)}, states

    # A bad file: refused whole, logged; the old rules go on.
    d.rules_path.write_text(RULES + "    bogus: 1\n")
    d.proc.send_signal(signal.SIGHUP)
    assert wait_log(d, "alert rules NOT reloaded"), d.log_text()
    assert "unknown field 'bogus'" in d.log_text()
    text = scrape(d)
    assert sample(text, "rvd_alert_reload_failures_total") == 1
    assert sample(text, "rvd_alert_rules") == 3
    n = len(w.alerts())
    measure(d, "alert-h", 16, 4)  # R_V 1: rv_floor and layer1_low resolve
    resolved = {a.alert for a in w.wait_for(n + 3)[n:]
                if a.state == rvd_pb2.ALERT_STATE_RESOLVED}
    assert resolved == {"rv_floor", "layer1_low", "rv_alert_threshold"}
    assert d.proc.poll() is None  # still serving


def test_bad_rules_file_stops_rvd_at_start(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - name: x\n    drop: {baseline: max, fraction: 1.5}\n")
    cfg = tmp_path / "rvd.yaml"
    cfg.write_text(f"grpc_address: 127.0.0.1:0\nmetrics_address: ''\nbackend: cpu\n"
                   f"alert_rules_file: {json.dumps(str(bad))}\n")
    r = subprocess.run([str(RVD), "--config", str(cfg)], capture_output=True,
                       text=True, timeout=30 * TIME_SCALE)
    assert r.returncode != 0
    assert "rule 1 ('x'): drop: fraction" in r.stderr and "(0, 1)" in r.stderr, r.stderr
    missing = tmp_path / "none.yaml"
    r = subprocess.run([str(RVD), "--config", str(cfg), "--alert-rules-file",
                        str(missing)], capture_output=True, text=True,
                       timeout=30 * TIME_SCALE)
    assert r.returncode != 0 and "does not exist" in r.stderr, r.stderr
