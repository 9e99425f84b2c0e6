"""pytest set-up for the Python client's tests: the package from
client/python (its stubs written there by the build), the real rvd from
$RVD_BUILD_DIR started by tests/integration/rvdtest.py's Daemon."""
import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "client" / "python"))
sys.path.insert(1, str(ROOT / "tests" / "integration"))
sys.path.insert(2, str(pathlib.Path(__file__).resolve().parent))

from daemons import start_daemon  # noqa: E402
from rvdtest import ExitWithoutGrpcShutdown  # noqa: E402


def pytest_configure(config):
    config.pluginmanager.register(ExitWithoutGrpcShutdown())


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = start_daemon(tmp_path_factory.mktemp("rvd"))
    yield d
    d.stop()


@pytest.fixture
def seed():
    """A fresh seed per test, printed so that a failure can be replayed."""
    s = int(os.environ.get("RVD_TEST_SEED", int.from_bytes(os.urandom(4), "little")))
    print(f"seed={s}")
    return s
