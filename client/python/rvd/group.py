"""A sharded model's group (issue 18), as RVMonitor(process_group=...) fills
it in: which rows of which layer's V this rank holds, and the group's
rvd.v1.ShardGroup (group id, world size, rank, the coordinator's address and
every rank's rvd address).

Every rank runs its own rvd (a sidecar, or the DaemonSet's instance for its
GPU) and sends its rows to it by copy; the rvd instances exchange what the
cross blocks need and rank 0's rvd (the coordinator) stores the group's
measurement (docs/ARCHITECTURE.md, "Sharded models").

The splits (`sharding`):
  "tp"    tensor parallelism, Megatron-style column-parallel V: rank r of a
          world of p holds rows [r * n, (r + 1) * n) of every layer's V
          (n = its local rows, p * n = num_kv_heads * head_dim when the
          geometry is known): whole heads, contiguous, in rank order.
  "fsdp"  FSDP2's Shard(0): torch.chunk's split of each V along its rows,
          ceil(N / p) rows per rank, the last ranks fewer (or none). From a
          DTensor (torch >= 2.4: its global shape and its local tensor), else
          from a plain local tensor with N = num_kv_heads * head_dim.
  "pp"    pipeline parallelism: a rank holds whole layers (those its model
          has, under their global layer numbers).
  shard_rows={layer: (first_row, total_rows)} gives every held layer's
  place explicitly and overrides the split's rule (any row split).

Only V_LAYOUT_SEPARATE weights (a v_proj of their own) are sharded here: a
fused QKV weight's shard holds Q and K rows too.
"""
import socket
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from ._stubs import rvd_pb2

SHARDINGS = ("tp", "fsdp", "pp")
_LOOPBACK = ("127.", "localhost", "[::1]", "::1")


@dataclass
class Group:
    """This rank's place in the group (the same group_id, model_id,
    world_size, peers on every rank)."""
    group_id: str
    model_id: str
    world_size: int
    rank: int
    peers: List[str]  # every rank's rvd address, by rank; peers[0] coordinates

    def proto(self, shards):
        """The rvd.v1.ShardGroup of a measurement; shards: [ShardRows]."""
        return rvd_pb2.ShardGroup(
            group_id=self.group_id, world_size=self.world_size, rank=self.rank,
            coordinator=self.peers[0], peers=list(self.peers), shards=shards)


def is_dtensor(w):
    return hasattr(w, "to_local") and hasattr(w, "placements")


def local_tensor(w):
    """The rank's own rows of a weight (a DTensor's local shard)."""
    return w.to_local() if is_dtensor(w) else w


def chunk_rows(total, world, rank):
    """torch.chunk's (FSDP2 Shard(0)) rows of `rank`: (first_row, rows)."""
    per = -(-total // world)
    first = min(total, rank * per)
    return first, max(0, min(per, total - first))


def shard_rows_of(sharding, weight, layer, world, rank, geometry, explicit):
    """(first_row, total_rows) of this rank's rows of `layer`, whose weight
    (as the model holds it) is `weight`; ValueError saying what does not
    fit. geometry: (H, K, d) or None."""
    local_rows = int(local_tensor(weight).shape[0])
    whole = geometry[1] * geometry[2] if geometry is not None else None
    if explicit is not None and layer in explicit:
        first, total = (int(x) for x in explicit[layer])
        if first < 0 or first + local_rows > total:
            raise ValueError(f"layer {layer}: shard_rows ({first}, {total}) do not "
                             f"hold this rank's {local_rows} rows")
        return first, total
    if sharding == "pp":
        return 0, local_rows
    if sharding == "tp":
        total = whole if whole is not None else world * local_rows
        if world * local_rows != total:
            raise ValueError(
                f"layer {layer}: tensor parallelism over {world} ranks with "
                f"{local_rows} local rows does not split the layer's {total} rows "
                "(num_kv_heads * head_dim) evenly; pass shard_rows=")
        return rank * local_rows, total
    if sharding == "fsdp":
        if is_dtensor(weight):
            placements = tuple(weight.placements)
            if len(placements) != 1 or getattr(placements[0], "dim", None) != 0 \
                    or not placements[0].is_shard():
                raise ValueError(f"layer {layer}: a DTensor placed {placements}; "
                                 "rvd takes Shard(0) on a 1-D mesh")
            total = int(weight.shape[0])
        elif whole is not None:
            total = whole
        else:
            raise ValueError(f"layer {layer}: FSDP rows of a plain tensor need the "
                             "head geometry (num_kv_heads * head_dim) or shard_rows=")
        first, rows = chunk_rows(total, world, rank)
        if rows != local_rows:
            raise ValueError(
                f"layer {layer}: rank {rank} holds {local_rows} rows; FSDP's "
                f"Shard(0) of {total} rows over {world} ranks gives it {rows}; "
                "pass shard_rows=")
        return first, total
    raise ValueError(f"sharding={sharding!r}: expected one of {', '.join(SHARDINGS)}")


def form(process_group, model_id, address, group_address=None, group_id=None):
    """The Group of this rank: one all_gather_object over `process_group`
    (every rank of it must call this, as for any collective). The model id
    and group id are rank 0's. group_address: the address peers' rvd
    instances dial to reach this rank's rvd (default: address); a loopback
    one is refused when the group spans hosts."""
    import torch.distributed as dist
    world = dist.get_world_size(process_group)
    rank = dist.get_rank(process_group)
    mine = {"address": group_address or address, "host": socket.gethostname(),
            "model_id": model_id, "group_id": group_id or f"{model_id}.group"}
    every: List[Optional[Dict]] = [None] * world
    dist.all_gather_object(every, mine, group=process_group)
    hosts = {e["host"] for e in every}
    if len(hosts) > 1:
        loop = [r for r, e in enumerate(every) if e["address"].startswith(_LOOPBACK)]
        if loop:
            raise ValueError(
                f"the group spans hosts {sorted(hosts)} but rank(s) {loop} give a "
                "loopback rvd address, which peers cannot reach: pass "
                "group_address= (this rvd's address as other hosts see it)")
    return Group(group_id=every[0]["group_id"], model_id=every[0]["model_id"],
                 world_size=world, rank=rank, peers=[e["address"] for e in every])


def rows_proto(layer, first, total):
    return rvd_pb2.ShardRows(layer=layer, first_row=first, total_rows=total)


def explicit_rows(shard_rows) -> Optional[Dict[int, Tuple[int, int]]]:
    if shard_rows is None:
        return None
    return {int(l): (int(v[0]), int(v[1])) for l, v in shard_rows.items()}
