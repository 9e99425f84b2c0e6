"""RVMonitor(process_group=...) (issue 18) on the CPU: torch.distributed
with gloo, 2 and 3 spawned ranks, each with its own real rvd (rank 0's is
the coordinator). Every rank holds its part of a Llama-shaped model (TP:
a slice of heads' rows of every v_proj; FSDP: torch.chunk's uneven row
split; PP: whole layers), trains a few steps (in-place updates), and every
measurement each rank records must equal numpy's float64 SVD of the whole
matrices gathered from the ranks at that step (per layer, per head, R_V,
2e-6). A rank that stops measuring fails the step on the others after rvd's
group timeout, with on_error="warn": training goes on."""
import json
import os
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import models
from daemons import start_daemon
from rvdtest import free_port, pr_oracle

RTOL = 2e-6
LAYERS, HEADS, KV, HIDDEN = 4, 6, 6, 48  # head_dim 8, 48 rows per V
STEPS, INTERVAL = 4, 2


def split_rows(kind, world, rank, rows):
    """{layer: (first, n)} of this rank, or None for a layer it lacks."""
    if kind == "tp":
        per = rows // world
        return {l: (rank * per, per) for l in range(LAYERS)}
    if kind == "fsdp":
        per = -(-rows // world)
        first = rank * per
        return {l: (first, min(per, rows - first)) for l in range(LAYERS)}
    owner = {2: [0, 0, 1, 1], 3: [0, 1, 1, 2]}[world]
    return {l: (0, rows) for l in range(LAYERS) if owner[l] == rank}


def local_model(kind, world, rank, seed):
    """The whole model (same seed on every rank), cut to this rank's part."""
    m = models.LlamaForCausalLM(layers=LAYERS, heads=HEADS, kv_heads=KV,
                                hidden=HIDDEN, seed=seed)
    rows = m.model.layers[0].self_attn.v_proj.weight.shape[0]
    mine = split_rows(kind, world, rank, rows)
    for l, layer in enumerate(m.model.layers):
        if l not in mine:
            m.model.layers[l] = torch.nn.Identity()  # another stage's layer
            continue
        first, n = mine[l]
        w = layer.self_attn.v_proj.weight
        layer.self_attn.v_proj.weight = torch.nn.Parameter(w.detach()[first:first + n].clone())
    return m, mine


def gathered(kind, world, m, mine):
    """{layer: whole V (float64)} from every rank's rows (all_gather)."""
    local = {l: (f, m.model.layers[l].self_attn.v_proj.weight.detach().double().numpy())
             for l, (f, _) in mine.items()}
    every = [None] * world
    dist.all_gather_object(every, local)
    whole = {}
    for part in every:
        for l, (f, w) in part.items():
            whole.setdefault(l, []).append((f, w))
    return {l: np.concatenate([w for _, w in sorted(ps, key=lambda p: p[0])])
            for l, ps in whole.items()}


def check(record, vs):
    """Largest relative error of a recorded measurement against the oracle."""
    worst = 0.0
    pr = {l: pr_oracle(v) for l, v in vs.items()}
    assert sorted(record.per_layer_pr) == list(range(LAYERS)), record.per_layer_pr
    for l, got in record.per_layer_pr.items():
        worst = max(worst, abs(got - pr[l]) / pr[l])
        d = vs[l].shape[0] // KV
        heads = record.per_head_pr[l]
        assert len(heads) == KV
        for h, got_h in enumerate(heads):
            want = pr_oracle(vs[l][h * d:(h + 1) * d])
            worst = max(worst, abs(got_h - want) / want)
    q = (LAYERS + 3) // 4
    rv = np.exp(np.mean(np.log([pr[l] for l in range(LAYERS - q, LAYERS)]))) / \
        np.exp(np.mean(np.log([pr[l] for l in range(q)])))
    assert record.rv is not None
    return max(worst, abs(record.rv - rv) / rv)


def rank_main(rank, world, port, kind, addresses, out, seed, stop_at, late=None, steps=STEPS):
    os.environ["RVD_ADDRESS"] = addresses[rank]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world)
    import rvd
    m, mine = local_model(kind, world, rank, seed)
    explicit = None
    if kind == "fsdp" and rank == world - 1:
        # the same rows given explicitly (torch without DTensor)
        explicit = {l: (f, KV * (HIDDEN // HEADS)) for l, (f, _) in mine.items()}
    monitor = rvd.RVMonitor(m, mode="training", measurement_interval=INTERVAL,
                            per_head=True, process_group=dist.group.WORLD,
                            sharding=kind, shard_rows=explicit, timeout=30,
                            on_error="warn")
    gen = torch.Generator().manual_seed(seed + rank)
    results = {"checked": 0, "worst": 0.0, "model_id": monitor.model_id,
               "skipped": [], "errors": [], "steps_done": 0}
    expected = {0: gathered(kind, world, m, mine)}  # step -> whole matrices
    for step in range(1, steps + 1):
        with torch.no_grad():
            for l in mine:
                w = m.model.layers[l].self_attn.v_proj.weight
                w.add_(0.05 * torch.randn(w.shape, generator=gen))
        expected[step] = gathered(kind, world, m, mine)
        if stop_at is not None and rank == world - 1 and step >= stop_at:
            continue  # this rank stops measuring (training goes on)
        if late is not None and rank == world - 1 and step == late[0]:
            time.sleep(late[1])  # this rank comes to the step after the group's timeout
        monitor.step()
        results["steps_done"] = step
        if monitor.last_error is not None and "first_error" not in results:
            results["first_error"] = str(monitor.last_error)
    for record in monitor.history:
        results["worst"] = max(results["worst"], check(record, expected[record.step]))
        results["checked"] += 1
        results.setdefault("steps", []).append(record.step)
    results["skipped"] = [list(s) for s in monitor.skipped]
    if monitor.last_error is not None:
        results["errors"].append(str(monitor.last_error))
    monitor.close()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


def run_group(tmp_path, kind, world, seed, timeout_s=10, stop_at=None, late=None,
              steps=STEPS):
    daemons = [start_daemon(tmp_path / f"rvd{r}", shard_group_timeout_seconds=timeout_s)
               for r in range(world)]
    try:
        addresses = [d.grpc_address for d in daemons]
        mp.spawn(rank_main, args=(world, free_port(), kind, addresses, str(tmp_path),
                                  seed, stop_at, late, steps), nprocs=world, join=True)
        results = [json.loads((tmp_path / f"rank{r}.json").read_text())
                   for r in range(world)]
        logs = [d.log_text() for d in daemons]
        return results, daemons, logs
    finally:
        for d in daemons:
            d.stop()


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("kind", ["tp", "fsdp", "pp"])
def test_group_monitor_equals_svd_of_gathered_matrices(tmp_path, seed, kind, world):
    results, daemons, _ = run_group(tmp_path, kind, world, seed)
    ids = {r["model_id"] for r in results}
    assert len(ids) == 1, ids  # rank 0's model id on every rank
    for rank, r in enumerate(results):
        assert r["skipped"] == [], (rank, r["skipped"], r["errors"])
        # registration (step 0) and every interval step
        assert r["steps"] == list(range(0, STEPS + 1, INTERVAL)), (rank, r)
        assert r["checked"] == STEPS // INTERVAL + 1
        assert r["worst"] <= RTOL, (rank, r["worst"])


def test_a_rank_that_stops_measuring_fails_the_step_and_training_goes_on(tmp_path, seed):
    results, _, logs = run_group(tmp_path, "tp", 3, seed, timeout_s=2, stop_at=INTERVAL)
    for rank in (0, 1):
        r = results[rank]
        assert r["steps_done"] == STEPS, r  # on_error="warn": every step ran
        assert r["steps"] == [0], r  # only the registration completed
        assert [s[0] for s in r["skipped"]] == list(range(INTERVAL, STEPS + 1, INTERVAL)), r
        # the first failure names the rank; after an expired deadline the
        # monitor pauses (1 s, doubling) or fails again the same way
        assert r["skipped"][0] == [INTERVAL, "interval", "DEADLINE_EXCEEDED"], r
        assert all(s[2] in ("DEADLINE_EXCEEDED", "PAUSED") for s in r["skipped"]), r
        assert "missing rank(s) 2" in r["first_error"], r
        assert r["worst"] <= RTOL
    assert "missing rank(s) 2" in logs[0]


def test_a_rank_late_for_one_step_then_every_rank_measures_again(tmp_path, seed):
    """Rank 2 comes to step 2 after the group's 2 s timeout: step 2 fails by
    DEADLINE_EXCEEDED on every rank, at different times (ranks 0 and 1 at
    the timeout, rank 2 a timeout after it came). A pause in seconds then
    ends at a different step on each rank, and the group did not measure
    again (one rank paused while the others measured, by turns); paused in
    steps, every rank skips the same steps and the group measures again
    from step 2 * INTERVAL on."""
    steps = 4 * INTERVAL
    results, _, logs = run_group(tmp_path, "tp", 3, seed, timeout_s=2, late=(INTERVAL, 3),
                                 steps=steps)
    for rank, r in enumerate(results):
        assert r["skipped"][0] == [INTERVAL, "interval", "DEADLINE_EXCEEDED"], (rank, r)
        assert r["steps"] == [0] + list(range(2 * INTERVAL, steps + 1, INTERVAL)), (rank, r)
        assert r["worst"] <= RTOL, (rank, r["worst"])
    assert "timed out" in logs[0]
