"""Starting rvd for the client's tests (tests/integration/rvdtest.py's
Daemon, with its data_dir created: rvd refuses a missing one)."""
from rvdtest import Daemon


def start_daemon(tmp, **config):
    """rvd on loopback with its data_dir under tmp; a second call with the
    same tmp restarts on that state."""
    (tmp / "data").mkdir(parents=True, exist_ok=True)
    return Daemon(tmp, **config)
