"""/metrics of a group's rvd instances (issue 18): after a 2-rank group
step every rank's rvd exports its own rvd_group_* series under its group id
and rank label, the coordinator alone the group's R_V; a step that a rank
misses is counted as deadline_exceeded on the rank that came."""

import grpc

from rvdtest import Daemon, metric, rvd_pb2, scrape
from test_shard import check_oracle, measure_group, model, splits


def test_each_rank_exports_its_own_group_series(tmp_path):
    ds = [Daemon(tmp_path, shard_group_timeout_seconds=2) for _ in range(2)]
    try:
        vs = model(2024)
        ok = measure_group(ds, 2, splits("tp", 2), vs, "g-metrics", "sharded-metrics", step=7)
        for rank in range(2):
            assert not isinstance(ok[rank], grpc.RpcError), (rank, ok[rank].details())
            check_oracle(ok[rank], vs)
        # Step 8 without rank 1: rank 0 waits out the group timeout.
        missed = measure_group(ds, 2, splits("tp", 2), vs, "g-metrics", "sharded-metrics",
                               step=8, skip=(1,))
        assert missed[0].code() == grpc.StatusCode.DEADLINE_EXCEEDED, missed[0].details()

        m0, m1 = scrape(ds[0]), scrape(ds[1])
        for text, rank in ((m0, 0), (m1, 1)):
            assert metric(text, "rvd_group_steps_total", group_id="g-metrics", rank=rank,
                          outcome="ok") == 1, text
            assert metric(text, "rvd_group_world_size", group_id="g-metrics", rank=rank) == 2
            seconds = metric(text, "rvd_group_step_seconds", group_id="g-metrics", rank=rank)
            assert seconds is not None and seconds > 0
        assert metric(m0, "rvd_group_steps_total", group_id="g-metrics", rank=0,
                      outcome="deadline_exceeded") == 1, m0
        assert metric(m0, "rvd_group_last_step", group_id="g-metrics", rank=0) == 8
        assert metric(m1, "rvd_group_last_step", group_id="g-metrics", rank=1) == 7
        assert metric(m0, "rvd_group_step_seconds", group_id="g-metrics", rank=0) >= 2
        # No rank label on another rank's series: each rvd shows only itself.
        assert metric(m0, "rvd_group_world_size", group_id="g-metrics", rank=1) is None
        assert metric(m1, "rvd_group_world_size", group_id="g-metrics", rank=0) is None
        # The group's result: on the coordinator only.
        rv = metric(m0, "rvd_rv", model_id="sharded-metrics")
        assert rv is not None and abs(rv - ok[0].rv) <= 1e-9 * abs(ok[0].rv), (rv, ok[0].rv)
        assert metric(m1, "rvd_rv", model_id="sharded-metrics") is None
    finally:
        for d in ds:
            d.stop()
