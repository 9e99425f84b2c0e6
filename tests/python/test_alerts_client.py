"""The Python client's alert iterator (Client.watch_alerts) against the real
rvd: the global rv_alert_threshold fires and resolves for a model, seen as
AlertEvent objects."""
import numpy as np
import pytest

import rvd
from daemons import start_daemon


@pytest.fixture(scope="module")
def alerting(tmp_path_factory):
    d = start_daemon(tmp_path_factory.mktemp("rvd-alerts"), rv_alert_threshold=0.5)
    yield d
    d.stop()


def two_layers(rng, late_rank):
    """Layer 0 of PR 8, layer 1 of PR late_rank: R_V = late_rank / 8."""
    out = []
    for l, rank in enumerate([8, late_rank]):
        u, _ = np.linalg.qr(rng.standard_normal((8, 8)))
        v, _ = np.linalg.qr(rng.standard_normal((16, 8)))
        s = np.zeros(8)
        s[:rank] = 1.0
        out.append(rvd.Tensor(l, ((u * s) @ v.T).astype(np.float32)))
    return out


def test_watch_alerts(alerting, seed):
    rng = np.random.default_rng(seed)
    c = rvd.Client(alerting.grpc_address)
    with c.watch_alerts("py-alert", after_sequence=0) as watch:
        events = iter(watch)
        low = c.measure("py-alert", two_layers(rng, 2), step=10,
                        early_layers=[0], late_layers=[1])
        assert low.rv == pytest.approx(0.25, rel=1e-4)
        got = next(events)
        assert isinstance(got, rvd.AlertEvent)
        assert (got.alert, got.model_id, got.state, got.previous_state) == (
            "rv_alert_threshold", "py-alert", "firing", "inactive")
        assert got.measurement_sequence == low.sequence and got.step == 10
        assert got.value == pytest.approx(0.25, rel=1e-4) and got.threshold == 0.5
        assert got.since == pytest.approx(low.timestamp, abs=1e-6)
        c.measure("py-alert", two_layers(rng, 8), step=20,
                  early_layers=[0], late_layers=[1])
        got = next(events)
        assert (got.state, got.step) == ("resolved", 20)
    assert list(events) == []  # cancelled by the with block: ends quietly
    # A cursor above the newest event is an RvdError naming the call.
    with pytest.raises(rvd.RvdError) as e:
        next(iter(c.watch_alerts(after_sequence=10**9)))
    assert e.value.code_name == "OUT_OF_RANGE"
