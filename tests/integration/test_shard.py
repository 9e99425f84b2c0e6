"""Sharded models (issue 18) on the CPU: 2 and 3 real rvd processes form a
group (rank 0's rvd is the coordinator), a model's V set is row-split across
them (tensor-parallel by heads, an uneven FSDP-like split, pipeline-parallel
layers), every rank sends its rows by copy (MeasureStream with its
ShardGroup), and the group's recorded PR per layer and per head and its R_V
equal a float64 SVD of the whole matrices. A rank that never reports fails
the step naming it within the timeout; a rank whose rvd restarts mid-step
fails the old attempt and the step then completes."""
import signal
import threading
import time

import numpy as np
import pytest

from rvdtest import Daemon, grpc, pr_oracle, rvd_pb2, spectrum_matrix

RTOL = 2e-6
LAYERS, KV, HEAD_DIM, HIDDEN = 4, 6, 8, 48
ROWS = KV * HEAD_DIM


def model(seed):
    rng = np.random.default_rng(seed)
    print(f"seed {seed}")
    return {l: spectrum_matrix(rng, ROWS, HIDDEN, 0.2 + 0.3 * l) for l in range(LAYERS)}


def splits(kind, world):
    """{rank: {layer: (first_row, rows)}} for a split of every layer."""
    if kind == "tp":  # by heads, KV divisible by the world
        per = ROWS // world
        return {r: {l: (r * per, per) for l in range(LAYERS)} for r in range(world)}
    if kind == "fsdp":  # uneven, across head boundaries
        cuts = {2: [0, 19, ROWS], 3: [0, 13, 30, ROWS]}[world]
        return {r: {l: (cuts[r], cuts[r + 1] - cuts[r]) for l in range(LAYERS)}
                for r in range(world)}
    if kind == "pp":  # whole layers on one rank each
        owner = {2: [0, 0, 1, 1], 3: [0, 1, 1, 2]}[world]
        return {r: {l: (0, ROWS) for l in range(LAYERS) if owner[l] == r}
                for r in range(world)}
    raise ValueError(kind)


def rank_request(group, world, rank, daemons, vs, rows, model_id, step, per_head=True):
    tensors, shard_rows, blobs = [], [], []
    for l, (first, n) in sorted(rows.items()):
        part = np.ascontiguousarray(vs[l][first:first + n])
        tensors.append(rvd_pb2.TensorSpec(
            name=f"layers.{l}.v_proj", layer=l, dtype=rvd_pb2.DTYPE_F32,
            shape=list(part.shape), layout=rvd_pb2.V_LAYOUT_SEPARATE,
            geometry=rvd_pb2.HeadGeometry(num_heads=KV, num_kv_heads=KV, head_dim=HEAD_DIM)))
        shard_rows.append(rvd_pb2.ShardRows(layer=l, first_row=first, total_rows=ROWS))
        blobs.append(part.tobytes())
    header = rvd_pb2.MeasureHeader(
        model_id=model_id, step=step, per_head=per_head, tensors=tensors,
        shard_group=rvd_pb2.ShardGroup(
            group_id=group, world_size=world, rank=rank,
            coordinator=daemons[0].grpc_address,
            peers=[d.grpc_address for d in daemons[:world]], shards=shard_rows))
    msgs = [rvd_pb2.MeasureChunk(header=header)]
    msgs += [rvd_pb2.MeasureChunk(tensor_index=i, offset=0, data=b) for i, b in enumerate(blobs)]
    return msgs


def send(daemon, msgs, results, key, timeout=60):
    try:
        results[key] = daemon.stub.MeasureStream(iter(msgs), timeout=timeout)
    except grpc.RpcError as e:
        results[key] = e


def measure_group(daemons, world, split, vs, group, model_id, step=1, skip=()):
    results, threads = {}, []
    for rank in range(world):
        if rank in skip:
            continue
        msgs = rank_request(group, world, rank, daemons, vs, split[rank], model_id, step)
        t = threading.Thread(target=send, args=(daemons[rank], msgs, results, rank))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    return results


def check_oracle(m, vs):
    assert [x.layer for x in m.layers] == list(range(LAYERS))
    pr = {}
    for x in m.layers:
        pr[x.layer] = pr_oracle(vs[x.layer])
        assert abs(x.pr - pr[x.layer]) <= RTOL * pr[x.layer], (x.layer, x.pr, pr[x.layer])
        assert len(x.head_pr) == KV
        for h, got in enumerate(x.head_pr):
            want = pr_oracle(vs[x.layer][h * HEAD_DIM:(h + 1) * HEAD_DIM])
            assert abs(got - want) <= RTOL * want, (x.layer, h, got, want)
    quarter = (LAYERS + 3) // 4
    early = [pr[l] for l in range(quarter)]
    late = [pr[l] for l in range(LAYERS - quarter, LAYERS)]
    rv = np.exp(np.mean(np.log(late))) / np.exp(np.mean(np.log(early)))
    assert m.HasField("rv") and abs(m.rv - rv) <= RTOL * rv, (m.rv, rv)


@pytest.fixture(scope="module")
def daemons(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("shard")
    ds = [Daemon(tmp, shard_group_timeout_seconds=10) for _ in range(3)]
    yield ds
    for d in ds:
        d.stop()


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("kind", ["tp", "fsdp", "pp"])
def test_group_equals_svd_of_whole_matrices(daemons, world, kind):
    vs = model(1000 + 10 * world + len(kind))
    group, model_id = f"g-{kind}-{world}", f"sharded-{kind}-{world}"
    results = measure_group(daemons, world, splits(kind, world), vs, group, model_id)
    for rank in range(world):
        r = results[rank]
        assert not isinstance(r, grpc.RpcError), (rank, r.details())
        check_oracle(r, vs)
        assert f"partial sums of {world} ranks" in " ".join(r.warnings)
    # Stored once, on the coordinator only.
    latest = daemons[0].stub.GetLatest(rvd_pb2.GetLatestRequest(model_id=model_id))
    check_oracle(latest, vs)
    assert latest.sequence == results[0].sequence
    for d in daemons[1:world]:
        with pytest.raises(grpc.RpcError) as e:
            d.stub.GetLatest(rvd_pb2.GetLatestRequest(model_id=model_id))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
    # A second step of the same group.
    again = measure_group(daemons, world, splits(kind, world), vs, group, model_id, step=2)
    assert all(again[r].step == 2 for r in range(world))


def test_shards_that_do_not_tile_a_layer_fail(daemons):
    vs = model(7)
    split = splits("tp", 2)
    split[1][0] = (ROWS // 2 + 1, ROWS // 2 - 1)  # a row of layer 0 held by nobody
    results = measure_group(daemons, 2, split, vs, "g-gap", "sharded-gap")
    for rank in range(2):
        assert isinstance(results[rank], grpc.RpcError)
        assert results[rank].code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "do not tile" in results[rank].details(), results[rank].details()


def test_a_rank_that_never_reports_fails_the_step_naming_it(tmp_path):
    ds = [Daemon(tmp_path, shard_group_timeout_seconds=2) for _ in range(3)]
    try:
        vs = model(11)
        start = time.monotonic()
        results = measure_group(ds, 3, splits("tp", 3), vs, "g-missing", "sharded-missing",
                                skip=(2,))
        elapsed = time.monotonic() - start
        assert elapsed < 2 + 3, elapsed  # the timeout, not a hang
        for rank in (0, 1):
            r = results[rank]
            assert isinstance(r, grpc.RpcError), rank
            assert r.code() == grpc.StatusCode.DEADLINE_EXCEEDED, r.details()
            assert "missing rank(s) 2" in r.details(), r.details()
        assert "missing rank(s) 2" in ds[0].log_text()
        with pytest.raises(grpc.RpcError):
            ds[0].stub.GetLatest(rvd_pb2.GetLatestRequest(model_id="sharded-missing"))
        # The next step with every rank: nothing of the failed one is left
        # over (rows in the inboxes, the coordinator's attempt).
        results = measure_group(ds, 3, splits("tp", 3), vs, "g-missing", "sharded-missing",
                                step=2)
        for rank in range(3):
            assert not isinstance(results[rank], grpc.RpcError), results[rank].details()
            assert results[rank].step == 2
            check_oracle(results[rank], vs)
    finally:
        for d in ds:
            d.stop()


def test_waiting_on_the_group_is_not_stream_idle_time(tmp_path):
    """The stream idle watchdog (1 s here) watches the client while rvd
    receives; rank 0's stream, received whole, then waits 2.5 s for rank 1
    (the group timeout, 10 s, bounds that wait): it must not be cancelled."""
    ds = [Daemon(tmp_path, shard_group_timeout_seconds=10, stream_idle_timeout_seconds=1)
          for _ in range(2)]
    try:
        vs = model(17)
        split = splits("fsdp", 2)
        msgs = {r: rank_request("g-idle", 2, r, ds, vs, split[r], "sharded-idle", 1)
                for r in range(2)}
        results = {}
        t = threading.Thread(target=send, args=(ds[0], msgs[0], results, 0))
        t.start()
        time.sleep(2.5)  # rank 0 waits on the group, well past the idle timeout
        send(ds[1], msgs[1], results, 1)
        t.join()
        for rank in range(2):
            r = results[rank]
            assert not isinstance(r, grpc.RpcError), (rank, r.code(), r.details())
            check_oracle(r, vs)
    finally:
        for d in ds:
            d.stop()


def test_a_rank_restarting_mid_step(tmp_path):
    ds = [Daemon(tmp_path, shard_group_timeout_seconds=20) for _ in range(2)]
    try:
        vs = model(13)
        split = splits("fsdp", 2)
        msgs = {r: rank_request("g-restart", 2, r, ds, vs, split[r], "sharded-restart", 1)
                for r in range(2)}
        # Rank 1 reports step 1 and waits on the coordinator; its rvd dies.
        results = {}
        t = threading.Thread(target=send, args=(ds[1], msgs[1], results, "old"))
        t.start()
        time.sleep(1)  # its rows sent and its report waiting (no log line marks it)
        ds[1].proc.send_signal(signal.SIGKILL)
        ds[1].proc.wait()
        t.join()
        assert isinstance(results["old"], grpc.RpcError)
        ds[1].stop()
        ds[1] = Daemon(tmp_path, shard_group_timeout_seconds=20,
                       grpc_address=ds[1].grpc_address)
        # The new rvd of rank 1 reports again, then rank 0: the old attempt
        # fails (rank 1 restarted), the new one completes.
        t = threading.Thread(target=send, args=(ds[1], msgs[1], results, 1))
        t.start()
        time.sleep(0.5)
        send(ds[0], msgs[0], results, 0)
        t.join()
        for rank in range(2):
            assert not isinstance(results[rank], grpc.RpcError), results[rank].details()
            check_oracle(results[rank], vs)
        assert "rank 1 restarted" in ds[0].log_text()
    finally:
        for d in ds:
            d.stop()


def test_rows_over_one_message_are_sent_in_chunks(tmp_path):
    """Each rank's rows (2 layers of 2048 x 2100 f32: 16.4 MiB a layer)
    exceed the 16 MiB gRPC message limit of ExchangeShard, so the
    exchange is split per layer and each layer's rows in row ranges."""
    layers, kv, head_dim, hidden, world = 2, 32, 128, 2100, 2
    rows = kv * head_dim
    seed = 4096
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    scale = np.arange(1, hidden + 1, dtype=np.float64)
    vs = {l: (rng.standard_normal((rows, hidden)) * scale ** -(0.2 + 0.3 * l)).astype(np.float32)
          for l in range(layers)}
    per = rows // world
    ds = [Daemon(tmp_path, shard_group_timeout_seconds=60) for _ in range(world)]
    try:
        results, threads = {}, []
        for rank in range(world):
            tensors, shard_rows, msgs = [], [], []
            for l in range(layers):
                tensors.append(rvd_pb2.TensorSpec(
                    name=f"layers.{l}.v_proj", layer=l, dtype=rvd_pb2.DTYPE_F32,
                    shape=[per, hidden], layout=rvd_pb2.V_LAYOUT_SEPARATE,
                    geometry=rvd_pb2.HeadGeometry(num_heads=kv, num_kv_heads=kv,
                                                  head_dim=head_dim)))
                shard_rows.append(rvd_pb2.ShardRows(layer=l, first_row=rank * per,
                                                    total_rows=rows))
            header = rvd_pb2.MeasureHeader(
                model_id="sharded-big", step=1, per_head=True, tensors=tensors,
                shard_group=rvd_pb2.ShardGroup(
                    group_id="g-big", world_size=world, rank=rank,
                    coordinator=ds[0].grpc_address, peers=[d.grpc_address for d in ds],
                    shards=shard_rows))
            msgs.append(rvd_pb2.MeasureChunk(header=header))
            for l in range(layers):
                blob = np.ascontiguousarray(vs[l][rank * per:(rank + 1) * per]).tobytes()
                assert len(blob) > 16 << 20
                step = 4 << 20  # MeasureStream's own messages under the limit too
                msgs += [rvd_pb2.MeasureChunk(tensor_index=l, offset=o, data=blob[o:o + step])
                         for o in range(0, len(blob), step)]
            t = threading.Thread(target=send, args=(ds[rank], msgs, results, rank, 300))
            t.start()
            threads.append(t)
        for t in threads:
            t.join()
        pr = {}
        for l in range(layers):
            pr[l] = pr_oracle(vs[l])
        for rank in range(world):
            m = results[rank]
            assert not isinstance(m, grpc.RpcError), (rank, m.details())
            assert [x.layer for x in m.layers] == list(range(layers))
            for x in m.layers:
                assert abs(x.pr - pr[x.layer]) <= RTOL * pr[x.layer], (x.layer, x.pr, pr[x.layer])
                assert len(x.head_pr) == kv
                for h in (0, kv // 2 - 1, kv // 2, kv - 1):  # heads on either side of the cut
                    want = pr_oracle(vs[x.layer][h * head_dim:(h + 1) * head_dim])
                    assert abs(x.head_pr[h] - want) <= RTOL * want, (x.layer, h, x.head_pr[h])
            rv = pr[layers - 1] / pr[0]
            assert m.HasField("rv") and abs(m.rv - rv) <= RTOL * rv, (m.rv, rv)
    finally:
        for d in ds:
            d.stop()
