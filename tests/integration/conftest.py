"""pytest fixtures: the real rvd on loopback (see rvdtest.py)."""
import pathlib

import pytest

from rvdtest import Daemon, ExitWithoutGrpcShutdown


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = Daemon(tmp_path_factory.mktemp("rvd"), per_head_metrics=True,
               rv_alert_threshold=0.5)
    yield d
    d.stop()


def pytest_configure(config):
    config.pluginmanager.register(ExitWithoutGrpcShutdown())
    # pytest creates --basetemp without its parents (ctest passes
    # BUILD/pytest-tmp/integration_NAME, as tests/deploy's conftest says).
    if config.option.basetemp:
        pathlib.Path(config.option.basetemp).resolve().parent.mkdir(parents=True, exist_ok=True)
