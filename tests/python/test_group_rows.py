"""rvd/group.py's placement of a rank's rows (issue 18) without rvd: the
FSDP2 chunk rule against torch.chunk itself, TP's contiguous heads, the
refusals (uneven TP, a local shape FSDP does not give, explicit rows that
do not hold the shard, a loopback address in a group across hosts), and
RVMonitor's refusals with a process group."""
import types

import pytest
import torch

import models
import rvd
from rvd import group


@pytest.mark.parametrize("total,world", [(48, 2), (48, 5), (7, 3), (2, 4), (130, 8)])
def test_chunk_rows_is_torch_chunk(total, world):
    pieces = torch.arange(total).chunk(world)
    for rank in range(world):
        first, n = group.chunk_rows(total, world, rank)
        want = pieces[rank].tolist() if rank < len(pieces) else []
        assert list(range(first, first + n)) == want, (rank, first, n)


def w(rows, cols=16):
    return torch.zeros(rows, cols)


def test_tp_rows_are_contiguous_heads_in_rank_order():
    geometry = (8, 4, 8)  # 32 rows
    got = [group.shard_rows_of("tp", w(8), 0, 4, r, geometry, None) for r in range(4)]
    assert got == [(0, 32), (8, 32), (16, 32), (24, 32)]
    with pytest.raises(ValueError, match="does not split"):
        group.shard_rows_of("tp", w(12), 0, 4, 1, geometry, None)


def test_fsdp_rows_and_refusals():
    geometry = (6, 6, 8)  # 48 rows, chunks of 10 over 5 ranks: 10 10 10 10 8
    assert group.shard_rows_of("fsdp", w(8), 3, 5, 4, geometry, None) == (40, 48)
    with pytest.raises(ValueError, match="gives it 10"):
        group.shard_rows_of("fsdp", w(8), 3, 5, 1, geometry, None)
    with pytest.raises(ValueError, match="need the head geometry"):
        group.shard_rows_of("fsdp", w(8), 3, 5, 4, None, None)
    # explicit rows override the rule, and must hold the shard
    assert group.shard_rows_of("fsdp", w(8), 3, 5, 1, geometry, {3: (5, 48)}) == (5, 48)
    with pytest.raises(ValueError, match="do not hold"):
        group.shard_rows_of("fsdp", w(8), 3, 5, 1, geometry, {3: (45, 48)})


def test_pp_holds_whole_layers():
    assert group.shard_rows_of("pp", w(24), 2, 3, 1, (6, 3, 8), None) == (0, 24)


def test_loopback_refused_across_hosts(monkeypatch):
    import torch.distributed as dist
    peers = [{"address": "10.0.0.1:50051", "host": "a", "model_id": "m", "group_id": "g"},
             {"address": "127.0.0.1:50051", "host": "b", "model_id": "x", "group_id": "y"}]

    def gather(out, mine, group=None):
        out[:] = peers
    monkeypatch.setattr(dist, "get_world_size", lambda g=None: 2)
    monkeypatch.setattr(dist, "get_rank", lambda g=None: 1)
    monkeypatch.setattr(dist, "all_gather_object", gather)
    with pytest.raises(ValueError, match=r"rank\(s\) \[1\] give a loopback"):
        group.form(object(), "x", "127.0.0.1:50051")
    peers[1]["address"] = "10.0.0.2:50051"
    g = group.form(object(), "x", "10.0.0.2:50051")
    assert (g.model_id, g.group_id, g.rank, g.peers) == \
        ("m", "g", 1, ["10.0.0.1:50051", "10.0.0.2:50051"])  # rank 0's ids


def test_monitor_refusals_with_a_process_group():
    m = models.LlamaForCausalLM(layers=2)
    pg = types.SimpleNamespace()
    with pytest.raises(ValueError, match="adaptive"):
        rvd.RVMonitor(m, mode="training", adaptive=True, process_group=pg,
                      sharding="tp", address="127.0.0.1:1")
    with pytest.raises(rvd.TransportUnavailable, match="shard group"):
        rvd.RVMonitor(m, mode="training", transport="ipc", process_group=pg,
                      sharding="tp", address="127.0.0.1:1")
    with pytest.raises(ValueError, match="sharding=None"):
        rvd.RVMonitor(m, mode="training", process_group=pg, address="127.0.0.1:1")
