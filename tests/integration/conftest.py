"""pytest fixtures: the real rvd on loopback (see rvdtest.py)."""
import pytest

from rvdtest import Daemon


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = Daemon(tmp_path_factory.mktemp("rvd"), per_head_metrics=True,
               rv_alert_threshold=0.5)
    yield d
    d.stop()
