"""Kernel tuning jobs (issue 17) through rvctl on the CPU engine: every
start is refused with the reason (no GPU to tune), the read-only commands
answer, the usage errors say what is missing, and /metrics has no
rvd_tuning_* families (they exist where jobs can run). The jobs
themselves run on the GPU host; their logic is covered by the unit tests
tune_job_manager_test, tune_loop_test and tune_service_test."""
import urllib.request

from rvdtest import rvd_pb2


def test_tune_start_on_the_cpu_engine_is_failed_precondition(daemon):
    r = daemon.rvctl("tune", "start", "--shape-class", "triangle", "--dtype", "bf16",
                     "--shapes", "480x128x4096", "--max-iter", "5", check=False)
    assert r.returncode == 1, r.stderr
    assert "FAILED_PRECONDITION" in r.stderr
    assert "kernel tuning needs a GPU" in r.stderr and "cpu engine" in r.stderr


def test_tune_list_status_watch_cancel(daemon):
    r = daemon.rvctl("tune", "list")
    assert r.stdout == ""
    r = daemon.rvctl("tune", "list", "--json")
    assert r.stdout.strip() == "{}"
    r = daemon.rvctl("tune", "status", "tune-1", "--iterations", check=False)
    assert r.returncode == 1 and "NOT_FOUND" in r.stderr
    for sub in ("status", "watch", "cancel"):
        r = daemon.rvctl("tune", sub, "tune-1", check=False)
        assert r.returncode == 1, (sub, r.stderr)
        assert "NOT_FOUND" in r.stderr and "tune-1" in r.stderr


def test_tune_usage_errors(daemon):
    for args, says in ((["tune"], "tune needs"),
                       (["tune", "start"], "--shape-class"),
                       (["tune", "start", "--shape-class", "tall", "--dtype", "f8"], "--dtype"),
                       (["tune", "start", "--shape-class", "tall", "--shapes", "4x5"], "COUNTxROWSxCOLS"),
                       (["tune", "status"], "needs a job id"),
                       (["tune", "bogus"], "unknown tune command")):
        r = daemon.rvctl(*args, check=False)
        assert r.returncode == 2, (args, r.stderr)
        assert says in r.stderr, (args, r.stderr)


def test_no_tuning_metrics_where_jobs_cannot_run(daemon):
    text = urllib.request.urlopen(f"http://{daemon.metrics_address}/metrics",
                                  timeout=5).read().decode()
    assert "rvd_tuning_" not in text


def test_the_api_documents_the_tune_job_messages():
    # The Python stubs carry the new messages (generated from rvd.proto).
    job = rvd_pb2.TuneJob(id="tune-1", state=rvd_pb2.TUNE_JOB_RUNNING)
    job.progress.candidates["slower"] = 2
    assert rvd_pb2.TuneJob.FromString(job.SerializeToString()).progress.candidates["slower"] == 2
    assert not rvd_pb2.TuneBudget().HasField("patience")  # unset: rvd's default
