"""The documented install: a venv over the system's packages and one pip
command that fetches nothing (client/python/README.md)."""
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_editable_install_in_a_venv(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=120)
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PYTHONPATH", None)
    r = subprocess.run([str(venv / "bin" / "pip"), "install", "--no-deps",
                        "--no-build-isolation", "-e", str(ROOT / "client" / "python")],
                       capture_output=True, text=True, timeout=300, env=env,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    code = ("import rvd, rvd.v1.rvd_pb2 as pb, torch; "
            "from rvd import architectures; "
            "print(rvd.__file__); print(architectures.architectures_path()); "
            "print(rvd.RVMonitor.__name__, pb.DESCRIPTOR.package)")
    r = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True,
                       text=True, timeout=120, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == str(ROOT / "client" / "python" / "rvd" / "__init__.py")
    assert lines[1] == str(ROOT / "config" / "architectures.yaml")
    assert lines[2] == "RVMonitor rvd.v1"
