"""RVMonitor: seed 000's monitor, backed by rvd (copy transport).

What it sends: the stored V tensor of every monitored layer (fused QKV and
GQA as stored; rvd cuts V out), with the layout and head geometry that
architectures.yaml gives (see architectures.py). rvd computes PR and R_V and
keeps the measurement; the monitor keeps its own history too.

When it measures (the policy; the history follows it step for step):
  inference  once at registration (the constructor); then .rv serves that
             cached result. step() only counts, and retries the
             registration's measurement if rvd could not be reached then.
  training   at registration (step 0), then at step n (the n-th step() call)
             when n % measurement_interval == 0; with adaptive also at any
             other step whose relative change over the monitored V set,
             ||W - W_last||_F / ||W_last||_F with W_last the weights of the
             last recorded measurement, exceeds delta_threshold (a strict >).
  both       a step at which no monitored weight changed since the last
             recorded measurement sends nothing (that result is still exact):
             unchanged weights never travel. "Changed" is read from each
             parameter's identity, storage pointer and in-place version
             counter (torch's `_version`, which optimizers bump), so checking
             costs no read of the weights. Writes through `param.data` (a
             tensor with its own counter) are not seen: call measure_now().
             The delta needs W_last: with adaptive the monitor keeps a copy
             of the monitored V set on the weights' device, and a step that
             changed the weights reads them once there and waits for that
             one reduction (a device synchronization per such step, in copy
             mode; rvd is to evaluate it on its side with the IPC transport).
  measure_now() always measures.

When rvd fails: on_error="warn" (default) logs, records the step in
.skipped and goes on (training never stops for rvd); a failure to reach rvd
(UNAVAILABLE) reconnects at once so the next due step tries a fresh
connection, and a deadline that expired (rvd too slow or the host silent)
also pauses measuring for a while (1 s, doubling to 5 min) so that a silent
host costs one deadline per pause, not one per step. A rank of a group
(process_group) pauses in steps instead: it measures only every 2nd, 4th,
... (at most 64th) interval step, counted from step 0, so that ranks whose
deadlines expired at different times still meet at the next multiple (a
pause in seconds ends at a different step on each rank, and a rank that
measures while another is paused fails the step again). The delta trigger
needs a recorded measurement to compare with; until the first one, only
interval steps measure. on_error="raise" raises rvd.RvdError instead.

transport: "copy" sends the bytes over gRPC, as above. "ipc" shares the
live weights with rvd once through CUDA IPC (rvd/ipc.py says how, and the
ordering that keeps every snapshot consistent) and then only notifies steps:
  registration  RegisterLiveModel with the weights as they are (the device
             is synchronized once); inference mode: rvd measures them then,
             and that is the result served (step() sends nothing);
  training   every step() notifies rvd (NotifyStep, not waited for), and rvd
             applies the policy itself (TriggerPolicy): it measures the first
             notified step (step 1), then the step measurement_interval steps
             after the last measured one and, with adaptive, any step whose
             delta against the last measured snapshot exceeds
             delta_threshold, computed by rvd on the GPU. The interval counts
             from the last measurement (a delta-triggered one included), not
             from step 0 as in copy mode. .rv and .history follow rvd's
             measurements of this model, which a background WatchMeasurements
             stream delivers (a measurement arrives a little after the step:
             .rv is the newest that arrived).
  ordering   with optimizer= (a torch >= 2.0 optimizer), a post-step hook
             records the trainer's interprocess event after each update and a
             pre-step hook makes the current stream wait on rvd's event before
             the next one: training never waits on the CPU for rvd's GPU work,
             and the next update cannot overwrite weights rvd has not copied
             yet. Without an optimizer, step() records the event and makes the
             current stream wait on rvd's before it returns (every later
             kernel waits for rvd's copy, about 0.2 ms for a 7B V set, not
             only the next update), which takes the notification's answer on
             the CPU (rvd answers once its copy is enqueued). Weights
             written outside the optimizer: wait_for_snapshot() first.
  rvd restarts  a notification answered NOT_FOUND registers again; UNAVAILABLE
             registers again once rvd answers (1 s, doubling to 30 s),
             following on_error.
  measure_now()  measures the weights as they are, by copy.
  close()    (also at exit and when the monitor is dropped) unregisters.
"auto": ipc when every monitored weight is on one CUDA device and rvd takes
the registration; copy when the weights are elsewhere, or rvd answers
FAILED_PRECONDITION (a backend without a GPU, another device),
UNIMPLEMENTED (an older rvd), PERMISSION_DENIED (an expandable segment's
descriptors) or refuses these weights otherwise (logged once). "ipc" raises
TransportUnavailable in those cases.
"""
import atexit
import collections
import csv
import dataclasses
import itertools
import json
import logging
import os
import re
import sys
import threading
import time
import weakref
from typing import List, Optional

import torch

from . import architectures, group as shard_group, ipc
from ._stubs import rvd_pb2
from .client import Client, layout_value
from .errors import RvdError, TransportUnavailable
from .types import RVMeasurement

log = logging.getLogger("rvd")

_DTYPES = {torch.float32: rvd_pb2.DTYPE_F32, torch.float16: rvd_pb2.DTYPE_F16,
           torch.bfloat16: rvd_pb2.DTYPE_BF16}
_ids = itertools.count(1)

# After a measurement's deadline expired: no measurement for this long,
# doubling per further expiry up to the maximum (seconds).
_BACKOFF_START_S = 1.0
_BACKOFF_MAX_S = 300.0
# The same in a group, in interval steps: after an expired deadline a rank
# measures only at the interval steps that are multiples of interval * this
# (2, doubling, a power of two so that every rank's pause steps are
# multiples of the shorter ones'); a success sets it back to 1.
_GROUP_BACKOFF_MAX = 64


# ipc: registering again after rvd could not be reached, at most this
# often (seconds), doubling to the maximum.
_REREGISTER_START_S = 1.0
_REREGISTER_MAX_S = 30.0
# rvd's reasons (NotifyStepResponse.reason) as RVMeasurement triggers.
_IPC_TRIGGERS = {"adaptive_check": "delta", "forced": "manual",
                 "inference": "registration"}
# Codes after which transport="auto" uses copy: rvd cannot take these weights.
_IPC_REFUSALS = frozenset({"FAILED_PRECONDITION", "UNIMPLEMENTED",
                           "PERMISSION_DENIED", "INVALID_ARGUMENT"})
_live_monitors = weakref.WeakSet()  # closed at exit (unregisters)


def _check_transport(transport):
    if transport not in ("auto", "ipc", "copy"):
        raise ValueError(f"transport={transport!r}: expected 'auto', 'ipc' or 'copy'")
    return transport


def _default_model_id(arch):
    base = re.sub(r"[^A-Za-z0-9_.:-]", "_", arch or "model")[:80]
    return f"{base}.{os.getpid()}.{next(_ids)}"


class RVMonitor:
    """Measures R_V of `model`'s V projections through rvd.

    The arguments are seed 000's, plus: address (rvd's HOST:PORT; default
    $RVD_ADDRESS, else 127.0.0.1:50051), transport ("auto" | "ipc" |
    "copy"), per_head (also the PR of every kv head), on_error ("warn" |
    "raise"), model_id (rvd's name for this model; default
    <arch>.<pid>.<n>), timeout (seconds a measurement may take) and client
    (an rvd.Client to share). early_layers and late_layers: both or neither
    (neither: every layer is sent and rvd takes the first and last quarter).
    optimizer: the torch optimizer that updates the weights, for the ipc
    transport's pre- and post-step hooks (see the module doc).

    A sharded model (issue 18; rvd/group.py): process_group (a
    torch.distributed group, every rank of it constructing its monitor),
    sharding ("tp" | "fsdp" | "pp"; default "fsdp" for DTensor weights),
    shard_rows ({layer: (first_row, total_rows)}, any split),
    group_address (the address other ranks' rvd instances reach this
    rank's rvd at; default: address) and group_id (default: from rank 0's
    model_id, which every rank uses). Each rank sends its rows by copy to
    its own rvd at the policy's interval steps; rank 0's rvd stores the
    group's measurement and every rank's monitor records it. A rank that
    does not measure a step fails it on the others after rvd's
    shard_group_timeout_seconds (on_error as for any failure). Interval
    steps only: adaptive and the unchanged-weights skip would let ranks
    decide differently.
    """

    def __init__(self, model, early_layers=None, late_layers=None,
                 mode="inference", measurement_interval=100, adaptive=False,
                 delta_threshold=0.01, arch=None, history_maxlen=1000,
                 prometheus=False, verbose=False, address=None,
                 transport="auto", per_head=False, on_error="warn",
                 model_id=None, timeout=30.0, client=None, optimizer=None,
                 process_group=None, sharding=None, shard_rows=None,
                 group_address=None, group_id=None):
        if mode not in ("inference", "training"):
            raise ValueError(f"mode={mode!r}: expected 'inference' or 'training'")
        if isinstance(measurement_interval, bool) or not isinstance(
                measurement_interval, int) or measurement_interval < 1:
            raise ValueError(f"measurement_interval={measurement_interval!r}: "
                             "expected an integer >= 1")
        if not delta_threshold >= 0:
            raise ValueError(f"delta_threshold={delta_threshold!r}: expected >= 0")
        if on_error not in ("warn", "raise"):
            raise ValueError(f"on_error={on_error!r}: expected 'warn' or 'raise'")
        if (early_layers is None) != (late_layers is None):
            raise ValueError("give both early_layers and late_layers, or neither "
                             "(then rvd uses the first and last quarter)")
        requested = _check_transport(transport)
        if process_group is not None:
            if adaptive:
                raise ValueError("adaptive with a process_group: the ranks would "
                                 "decide differently; interval steps only")
            if requested == "ipc":
                raise TransportUnavailable(
                    "transport='ipc' with a process_group: rvd's live "
                    "registrations do not take a shard group yet; use 'copy'")
            requested = "copy"
        self._closed = True  # until the constructor is through (close, __del__)
        self.model = model
        self._mode = mode
        self.measurement_interval = measurement_interval
        self.adaptive = bool(adaptive)
        self.delta_threshold = float(delta_threshold)
        self.per_head = bool(per_head)
        self.on_error = on_error
        self.verbose = verbose
        self.timeout = timeout

        self.resolved = architectures.resolve(
            model, arch, stage=process_group is not None and sharding == "pp")
        self.arch = self.resolved.arch
        found = self.resolved.tensors
        if early_layers is None:
            self.early_layers, self.late_layers = [], []
            self._layers = sorted(found)
        else:
            self.early_layers = sorted({int(l) for l in early_layers})
            self.late_layers = sorted({int(l) for l in late_layers})
            if not self.early_layers or not self.late_layers:
                raise ValueError("early_layers and late_layers must not be empty")
            self._layers = sorted(set(self.early_layers) | set(self.late_layers))
        if process_group is not None and sharding is None:
            sharding = "fsdp" if any(
                shard_group.is_dtensor(model.get_submodule(v.module_path).weight)
                for v in found.values()) else None
        if process_group is not None and sharding not in shard_group.SHARDINGS:
            raise ValueError(f"sharding={sharding!r} with a process_group: expected "
                             f"one of {', '.join(shard_group.SHARDINGS)}")
        if process_group is not None and sharding == "pp":
            # a stage holds some of the group's layers, under their numbers
            self._layers = [l for l in self._layers if l in found]
            if not self._layers:
                raise ValueError("this pipeline stage holds none of the "
                                 "monitored layers")
        missing = [l for l in self._layers if l not in found]
        if missing:
            raise ValueError(f"layers {missing} have no V projection; the model's "
                             f"layers are 0..{max(found)} ({self.resolved.pattern})")
        if self.resolved.geometry is None and self.resolved.layout != "separate":
            raise ValueError(f"{self.resolved.pattern}: a {self.resolved.layout} "
                             "weight needs the head geometry to cut V out: "
                             f"{self.resolved.geometry_source}")
        if self.per_head and self.resolved.geometry is None:
            raise ValueError(f"per_head needs the head geometry: "
                             f"{self.resolved.geometry_source}")
        self._modules = {l: model.get_submodule(found[l].module_path)
                         for l in self._layers}
        self._names = {l: found[l].name for l in self._layers}
        for l in self._layers:
            w = self._modules[l].weight
            if w.dtype not in _DTYPES and w.dtype != torch.float64:
                raise ValueError(f"{self._names[l]}: dtype {w.dtype} is not "
                                 "float32, float16, bfloat16 (or float64, sent "
                                 "as float32)")
        self.model_id = model_id or _default_model_id(self.arch)
        self._layout = layout_value(self.resolved.layout)

        self._owns_client = client is None
        self.client = client or Client(address, timeout=timeout)
        self.group = None  # rvd.group.Group of a sharded model
        self._shard_rows = {}  # group: {layer: (first_row, total_rows)}
        if process_group is not None:
            if self.resolved.layout != "separate":
                raise ValueError(f"{self.resolved.pattern}: a {self.resolved.layout} "
                                 "weight's shard holds Q and K rows too; rvd "
                                 "takes sharded V_LAYOUT_SEPARATE weights only")
            self.group = shard_group.form(process_group, self.model_id,
                                          self.client.address, group_address,
                                          group_id)
            self.model_id = self.group.model_id
            explicit = shard_group.explicit_rows(shard_rows)
            self._shard_rows = {
                l: shard_group.shard_rows_of(
                    sharding, self._modules[l].weight, l, self.group.world_size,
                    self.group.rank, self.resolved.geometry, explicit)
                for l in self._layers}
            # a rank holding no rows of a layer (FSDP, few rows) sends none
            self._layers = [l for l in self._layers
                            if shard_group.local_tensor(self._modules[l].weight).shape[0]]
        self._history = collections.deque(maxlen=history_maxlen)
        self._count = 0               # measurements recorded, ever
        self._latest: Optional[RVMeasurement] = None
        self._step = 0
        self._last_keys = None        # {layer: key} of the last recorded snapshot
        self._last_weights = {}       # adaptive: {layer: copy of W_last}
        self._last_sq = {}            # adaptive: {layer: ||W_last||_F^2}
        self.skipped = collections.deque(maxlen=1000)  # (step, trigger, code)
        self.last_error: Optional[RvdError] = None
        self._failing = 0             # failures since the last success
        self._paused_until = 0.0      # after an expired deadline
        self._backoff = 0.0
        self._group_every = 1         # group: measure every this many intervals
        self._pending_registration = False
        self._gauges = self._prometheus_gauges() if prometheus else None
        self._lock = threading.Lock()  # history and latest: the watch thread
        self._sequences = set()        # ipc: (sequence, step) recorded
        self._by_step = {}             # ipc: step -> record without its reason
        self._reasons = {}             # ipc: step -> trigger, before its record
        self._requested = requested
        self._link: Optional[ipc.LiveLink] = None
        self._watch: Optional[ipc.MeasurementWatch] = None
        self._hooks = ()
        self._optimizer = optimizer
        self._registered_ptrs = None   # ipc: {layer: data_ptr} registered
        self._closed = False

        self.transport = self._open_transport(requested)
        if self.transport == "copy":
            self._measure("registration")
            if self._latest is None and mode == "inference":
                self._pending_registration = True

    # ---- seed 000's properties ------------------------------------------

    @property
    def rv(self) -> Optional[float]:
        """The newest recorded R_V (None before the first measurement)."""
        return self._latest.rv if self._latest is not None else None

    @property
    def history(self) -> List[RVMeasurement]:
        with self._lock:
            return list(self._history)

    @property
    def layers(self) -> List[int]:
        return list(self._layers)

    @property
    def mode(self) -> str:
        return self._mode

    @property
    def steps(self) -> int:
        """step() calls so far."""
        return self._step

    # ---- the policy -------------------------------------------------------

    def _key(self, layer):
        w = shard_group.local_tensor(self._modules[layer].weight)
        return (w, w.data_ptr(), w._version)

    def _changed(self):
        """Monitored layers whose weight changed since the last recorded
        measurement (all of them before the first)."""
        if self._last_keys is None:
            return list(self._layers)
        return [l for l in self._layers
                if not _same(self._last_keys[l], self._key(l))]

    @torch.no_grad()
    def _delta(self, changed):
        """||W - W_last||_F / ||W_last||_F over the monitored V set; layers
        not in `changed` contribute 0 to the numerator."""
        num = None
        for l in changed:
            d = self._modules[l].weight.detach().float() - self._last_weights[l].float()
            s = torch.sum(d * d, dtype=torch.float64)
            num = s if num is None else num + s.to(num.device)
        num = float(num) if num is not None else 0.0
        den = sum(self._last_sq.values())
        if den == 0.0:
            return float("inf") if num > 0 else 0.0
        return (num / den) ** 0.5

    def step(self) -> Optional[float]:
        """Advances the step counter and measures when the policy says so
        (see the module doc). Returns the newest R_V."""
        self._step += 1
        n = self._step
        if self.transport == "ipc":
            return self._step_ipc(n)
        if self._mode == "inference":
            if self._pending_registration and time.monotonic() >= self._paused_until:
                self._measure("registration")
            return self.rv
        due = n % self.measurement_interval == 0
        if not due and not (self.adaptive and self._last_keys is not None):
            return self.rv  # nothing can trigger: not even the weights are looked at
        changed = self._changed() if self.group is None else self._layers
        if not changed:
            return self.rv
        trigger, delta = None, None
        if due:
            trigger = "interval"
        else:
            delta = self._delta(changed)
            if delta > self.delta_threshold:
                trigger = "delta"
        if trigger is None:
            return self.rv
        group_paused = self.group is not None and \
            n % (self.measurement_interval * self._group_every) != 0
        if time.monotonic() < self._paused_until or group_paused:
            self.skipped.append((n, trigger, "PAUSED"))
            return self.rv
        self._measure(trigger, delta)
        return self.rv

    def set_optimizer(self, optimizer):
        """Hooks the ipc transport's ordering into `optimizer` (a torch >= 2.0
        optimizer) instead of the one given before; None removes the hooks,
        and step() then waits on rvd's event itself (see the module doc).
        Does nothing with the copy transport but remember it."""
        if self._hooks:
            self._before_update()  # the notification in flight relied on them
        for h in self._hooks:
            h.remove()
        self._hooks = ()
        self._optimizer = optimizer
        if optimizer is not None and self.transport == "ipc" and \
                self._link is not None and self._link.registered:
            self._attach_hooks()

    def _attach_hooks(self):
        if self._mode != "training":
            return  # inference: rvd takes no snapshot after registering
        try:
            self._hooks = ipc.attach_optimizer(
                self._optimizer, self._before_update, self._after_update)
        except TypeError as e:
            log.warning("rvd: %s; step() waits on rvd's event itself", e)
            self._optimizer = None

    def wait_for_snapshot(self):
        """ipc: makes the current stream wait until rvd has copied the last
        notified step (the pre-step hook's work), so that weights written
        outside the optimizer after step() cannot reach that snapshot. The
        CPU waits only for rvd's answer to the notification. Nothing to do
        with the copy transport."""
        self._before_update()

    def measure_now(self) -> Optional[float]:
        """Measures now, whatever the policy, the weights as they are (by
        copy, whatever the transport); returns R_V (None when the
        measurement failed and on_error="warn")."""
        record = self._measure("manual")
        return record.rv if record is not None else None

    # ---- measuring --------------------------------------------------------

    def _spec(self, layer, dtype, shape):
        """The TensorSpec of one layer's stored V tensor."""
        rows, cols = shape
        whole = self._shard_rows[layer][1] if self.group is not None else rows
        g = self.resolved.geometry or (1, 1, whole)
        return rvd_pb2.TensorSpec(
            name=self._names[layer], layer=layer, dtype=_DTYPES[dtype],
            shape=[rows, cols], layout=self._layout,
            geometry=rvd_pb2.HeadGeometry(num_heads=g[0], num_kv_heads=g[1],
                                          head_dim=g[2]))

    def _tensor(self, layer):
        """(TensorSpec, bytes) of one layer's stored V tensor, as it is now."""
        w = shard_group.local_tensor(self._modules[layer].weight.detach())
        if w.device.type != "cpu":
            w = w.to("cpu")
        if w.dtype == torch.float64:
            w = w.to(torch.float32)
        w = w.contiguous()
        arr = w.view(torch.int16).numpy() if w.dtype == torch.bfloat16 else w.numpy()
        return self._spec(layer, w.dtype, tuple(w.shape)), memoryview(arr).cast("B")

    def _measure(self, trigger, delta=None):
        t0 = time.perf_counter()
        keys = {l: self._key(l) for l in self._layers}
        specs, payloads = zip(*(self._tensor(l) for l in self._layers))
        step = self._step if self._mode == "training" else None
        header = Client.header(self.model_id, list(specs), self._step,
                               self.early_layers, self.late_layers,
                               self.per_head)
        if self.group is not None:
            header.shard_group.CopyFrom(self.group.proto([
                shard_group.rows_proto(l, *self._shard_rows[l]) for l in self._layers]))
        try:
            m = self.client.measure_encoded(header, list(payloads), self.timeout)
        except RvdError as e:
            self._failed(e, trigger)
            return None
        elapsed_ms = (time.perf_counter() - t0) * 1e3
        record = RVMeasurement(
            rv=m.rv if m.HasField("rv") else None,
            per_layer_pr={l.layer: l.pr for l in m.layers},
            timestamp=m.timestamp.seconds + m.timestamp.nanos * 1e-9,
            step=step, elapsed_ms=elapsed_ms,
            per_head_pr={l.layer: list(l.head_pr) for l in m.layers if l.head_pr},
            sequence=m.sequence, trigger=trigger, delta=delta,
            engine_ms=m.elapsed_ms)
        self._record(record)
        self._pending_registration = False
        previous = self._last_keys
        self._last_keys = keys
        if self.adaptive and self.transport == "copy":
            with torch.no_grad():
                for l, (w, _, _) in keys.items():
                    if previous is not None and _same(previous[l], keys[l]):
                        continue  # unchanged: the copy kept is still W_last
                    self._last_weights[l] = w.detach().clone()
                    self._last_sq[l] = float(torch.sum(
                        w.detach().float() ** 2, dtype=torch.float64))
        self._answered()
        return record

    def _answered(self):
        """rvd answered a call: the failures are over."""
        if self._failing:
            log.info("rvd at %s answers again (model %s, step %d) after %d "
                     "failed call(s)", self.client.address,
                     self.model_id, self._step, self._failing)
        self._failing = 0
        self._backoff = 0.0
        self._group_every = 1

    def _record(self, record):
        """Appends a measurement to the history. With the ipc transport,
        once per (rvd sequence, step): the watch stream may deliver one
        recorded here already (a restarted rvd without data_dir numbers
        from 1 again, but never at the same step)."""
        with self._lock:
            if self._link is not None and record.sequence:
                key = (record.sequence, record.step)
                if key in self._sequences:
                    return False
                self._sequences.add(key)
                if len(self._sequences) > 4 * (self._history.maxlen or 1000):
                    self._sequences = {(r.sequence, r.step) for r in self._history}
                    self._sequences.add(key)
            self._history.append(record)
            self._count += 1
            if self._latest is None or self._latest.step is None or \
                    record.step is None or record.step >= self._latest.step:
                self._latest = record
        if self._gauges is not None:
            self._update_gauges(record)
        if self.verbose:
            log.info("rvd %s step %s (%s): R_V %s, %.2f ms", self.model_id,
                     record.step, record.trigger, record.rv,
                     record.elapsed_ms or 0.0)
        return True

    def _failed(self, error, trigger, step=None):
        self.last_error = error
        step = self._step if step is None else step
        self.skipped.append((step, trigger, error.code_name))
        self._failing += 1
        if error.unreachable:
            self.client.reconnect()
        if error.code_name == "DEADLINE_EXCEEDED" and self.group is not None:
            # the same steps on every rank (see the module doc)
            self._group_every = min(_GROUP_BACKOFF_MAX, 2 * self._group_every)
        elif error.code_name == "DEADLINE_EXCEEDED":
            self._backoff = min(_BACKOFF_MAX_S, max(_BACKOFF_START_S, 2 * self._backoff))
            self._paused_until = time.monotonic() + self._backoff
        elif self.transport == "ipc" and error.code_name == "UNAVAILABLE":
            # registered again once rvd answers: try at most this often
            self._backoff = min(_REREGISTER_MAX_S,
                                max(_REREGISTER_START_S, 2 * self._backoff))
            self._paused_until = time.monotonic() + self._backoff
        if self.on_error == "raise":
            raise error
        level = logging.WARNING if (self._failing == 1 or not error.unreachable) \
            else logging.DEBUG
        what = "notification" if trigger == "notify" else f"{trigger} measurement"
        log.log(level, "rvd: %s of model %s at step %d skipped "
                "(training goes on): %s", what, self.model_id, step, error)

    # ---- Prometheus (seed 000: rv_cuda_rv, rv_cuda_pr_layer) --------------

    def _prometheus_gauges(self):
        # rvd itself exports rvd_rv{model_id} and the per-layer PR on its
        # /metrics; these gauges are the seed's in-process ones, for a
        # trainer that already serves prometheus_client's registry.
        try:
            import prometheus_client
        except ImportError:
            log.warning("prometheus=True: prometheus_client is not installed; "
                        "rvd's own /metrics serves rvd_rv{model_id=\"%s\"}",
                        self.model_id)
            return None
        rv = _shared_gauge(prometheus_client, "rv_cuda_rv", "R_V of a model",
                           ["model_id"])
        pr = _shared_gauge(prometheus_client, "rv_cuda_pr_layer",
                           "PR of a layer's V projection", ["model_id", "layer"])
        return rv, pr

    def _update_gauges(self, record):
        rv, pr = self._gauges
        if record.rv is not None:
            rv.labels(self.model_id).set(record.rv)
        for layer, value in record.per_layer_pr.items():
            pr.labels(self.model_id, str(layer)).set(value)

    # ---- exports ----------------------------------------------------------

    def _record_json(self, r):
        d = dataclasses.asdict(r)
        d["per_layer_pr"] = {str(k): v for k, v in r.per_layer_pr.items()}
        d["per_head_pr"] = {str(k): v for k, v in r.per_head_pr.items()}
        return d

    def export_json(self, path):
        """Writes the monitor's settings and history (oldest first) as one
        JSON object; per-layer maps are keyed by the layer as a string."""
        doc = {
            "model_id": self.model_id, "arch": self.arch, "mode": self._mode,
            "layers": self.layers, "early_layers": self.early_layers,
            "late_layers": self.late_layers,
            "measurement_interval": self.measurement_interval,
            "adaptive": self.adaptive, "delta_threshold": self.delta_threshold,
            "per_head": self.per_head, "address": self.client.address,
            "measurements": self._count,
            "history": [self._record_json(r) for r in self.history],
        }
        with open(path, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")

    CSV_FIELDS = ("step", "timestamp", "rv", "elapsed_ms", "trigger", "delta",
                  "sequence")

    def export_csv(self, path):
        """One row per recorded measurement (oldest first): the CSV_FIELDS,
        then pr_layer_<l> for every monitored layer; empty cells for None."""
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(list(self.CSV_FIELDS) + [f"pr_layer_{l}" for l in self._layers])
            for r in self.history:  # a copy: the ipc watch appends meanwhile
                row = [getattr(r, k) for k in self.CSV_FIELDS]
                row += [r.per_layer_pr.get(l) for l in self._layers]
                w.writerow(["" if v is None else repr(v) if isinstance(v, float)
                            else v for v in row])

    def summary(self) -> str:
        """seed 000's summary: arch, mode, layers, the latest R_V, how many
        measurements were recorded (ever, not only those history keeps) and
        when the last one was taken."""
        latest = self._latest
        lines = ["RVMonitor",
                 f"  arch       : {self.arch or 'unknown (' + self.resolved.pattern + ')'}",
                 f"  mode       : {self._mode}",
                 f"  layers     : {self.layers}",
                 "  rv (latest): " + (f"{latest.rv:.6f}" if latest is not None
                                      and latest.rv is not None else "None"),
                 f"  # measurements: {self._count}"]
        if latest is None:
            lines.append("  last measured: never")
        else:
            lines.append(f"  last measured at step: {latest.step}, "
                         f"t={latest.timestamp:.1f}")
        return "\n".join(lines)

    def close(self):
        """Ends the ipc registration (UnregisterLiveModel), its watch and
        hooks, and the client's channel when the monitor made it. Called
        again, or at exit, it does nothing."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        for h in self._hooks:
            h.remove()
        self._hooks = ()
        if self._watch is not None:
            self._watch.stop()
        if self._link is not None:
            try:  # the trainer's stream past its waits on rvd's event
                self._link.cuda.synchronize()
            except Exception:  # noqa: BLE001 - closing at exit: CUDA may be gone
                pass
            self._link.unregister()
        if self._owns_client:
            self.client.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass

    # ---- the ipc transport (see the module doc and rvd/ipc.py) -------------

    def _ipc_device(self):
        """The one CUDA device of every monitored weight; IpcUnsupported
        saying why not otherwise."""
        devices = {self._modules[l].weight.device for l in self._layers}
        if len(devices) != 1 or next(iter(devices)).type != "cuda":
            raise ipc.IpcUnsupported(
                "the ipc transport needs every monitored V weight on one CUDA "
                f"device; they are on {sorted(str(d) for d in devices)}")
        for l in self._layers:
            if self._modules[l].weight.dtype not in _DTYPES:
                raise ipc.IpcUnsupported(
                    f"{self._names[l]}: dtype {self._modules[l].weight.dtype}: rvd "
                    "reads float32, float16 and bfloat16 in place")
        return next(iter(devices))

    def _live_request(self, device):
        """The RegisterLiveModelRequest of the monitored weights as they
        are now (the header's step is set at registration)."""
        segments = ipc.segment_sizes(device)
        tensors, ptrs = [], {}
        for l in self._layers:
            w = self._modules[l].weight.detach()
            spec = self._spec(l, w.dtype, tuple(w.shape))
            tensors.append(ipc.live_tensor(spec, w, ipc.share_tensor(w), segments))
            ptrs[l] = w.data_ptr()
        header = Client.header(self.model_id, [], 0, self.early_layers,
                               self.late_layers, self.per_head)
        mode = (rvd_pb2.TriggerPolicy.MODE_INFERENCE if self._mode == "inference"
                else rvd_pb2.TriggerPolicy.MODE_TRAINING)
        # rvd reads a threshold of 0 as its default (0.01); ours means "any
        # change", which the smallest positive double says.
        policy = rvd_pb2.TriggerPolicy(
            mode=mode, measurement_interval=self.measurement_interval,
            adaptive=self.adaptive,
            delta_threshold=self.delta_threshold or sys.float_info.min)
        request = rvd_pb2.RegisterLiveModelRequest(
            header=header, tensors=tensors,
            device_uuid=ipc.device_uuid(torch.cuda.get_device_properties(device)),
            producer_pid=os.getpid(), policy=policy)
        return request, ptrs

    def _open_transport(self, requested):
        """The transport the monitor uses: registers with rvd for "ipc" and
        "auto" (module doc); "copy" when auto may not use ipc."""
        if requested == "copy":
            return "copy"
        try:
            device = self._ipc_device()
            request, ptrs = self._live_request(device)
        except ipc.IpcUnsupported as e:
            if requested == "ipc":
                raise
            log.debug("rvd: model %s by copy: %s", self.model_id, e)
            return "copy"
        self._registered_ptrs = ptrs
        self._link = ipc.LiveLink(self.client, request, ipc.TorchCuda(device),
                                  self.timeout)
        self._link.on_response = self._on_response
        self._link.before_register = self._before_register
        self.transport = "ipc"
        _live_monitors.add(self)
        self._register_ipc("registration", measure_on_refusal=False)
        return self.transport  # copy after a refusal; else ipc (maybe pending)

    def _register_ipc(self, trigger, measure_on_refusal=True):
        """RegisterLiveModel; True when registered. A refusal (FAILED_
        PRECONDITION, UNIMPLEMENTED, ...) makes "auto" use copy from now on
        (and measure by copy, when measure_on_refusal) and "ipc" raise
        TransportUnavailable; other errors follow on_error and leave the
        registration pending (tried again by step())."""
        link = self._link
        try:
            response = link.register(self._step)
        except RvdError as e:
            if e.code_name in _IPC_REFUSALS:
                self._close_ipc()
                if self._requested == "ipc":
                    raise TransportUnavailable(
                        f"rvd at {self.client.address} does not take model "
                        f"{self.model_id}'s weights through CUDA IPC: "
                        f"{e.code_name}: {e.details}") from e
                log.warning("rvd at %s does not take live weights through CUDA "
                            "IPC (%s: %s): model %s by copy", self.client.address,
                            e.code_name, e.details, self.model_id)
                self.transport = "copy"
                if measure_on_refusal:
                    self._measure(trigger)
                    if self._latest is None and self._mode == "inference":
                        self._pending_registration = True
                return False
            self._failed(e, trigger)
            return False
        self._answered()
        if self._optimizer is not None and not self._hooks:
            self._attach_hooks()
        if response.HasField("measurement"):
            self._deliver_proto(response.measurement, "registration")
        if self.verbose:
            log.info("rvd: model %s registered live (%d segments, %d reused, "
                     "%d snapshot bytes, lease %d s)", self.model_id,
                     response.segments_mapped, response.segments_reused,
                     response.snapshot_bytes, response.lease_seconds)
        return True

    def _before_register(self, registrations):
        """Before each RegisterLiveModel: the watch starts (again) from rvd's
        newest measurement of the model. Again: rvd may have restarted
        without its log, numbering from 1, and a cursor from before would
        skip the new rvd's first measurements."""
        if self._watch is not None:
            if registrations == 0:
                return
            self._watch.stop()
            self._watch = None
        self._start_watch()

    def _start_watch(self):
        """The watch of this model's measurements, from rvd's newest one
        (a reused model_id's older history is not this monitor's)."""
        try:
            after = self.client.latest(self.model_id).sequence
        except RvdError as e:
            if e.code_name != "NOT_FOUND":
                raise
            after = 0
        self._watch = ipc.MeasurementWatch(self.client, self.model_id, after,
                                           self._deliver, self._watch_reset)

    def _close_ipc(self):
        if self._watch is not None:
            self._watch.stop()
            self._watch = None
        self._link = None
        _live_monitors.discard(self)

    def _step_ipc(self, n):
        link = self._link
        ptrs = self._registered_ptrs
        if link.registered and any(self._modules[l].weight.data_ptr() != ptrs[l]
                                   for l in self._layers):
            # a parameter was replaced or moved: share the new memory
            log.info("rvd: model %s's V weights moved at step %d: registering "
                     "them again", self.model_id, n)
            try:
                link.request, self._registered_ptrs = self._live_request(
                    self._ipc_device())
            except ipc.IpcUnsupported as e:
                raise TransportUnavailable(f"model {self.model_id}: {e}") from e
            link.registered = False
            self._paused_until = 0.0
        if not link.registered:
            if time.monotonic() < self._paused_until or \
                    not self._register_ipc("registration"):
                return self.rv
            return self.rv  # registered at step n: step n + 1 is notified first
        if self._mode == "inference":
            return self.rv  # rvd serves the registration's measurement
        try:
            link.notify(n, wait=self._optimizer is None)
        except RvdError as e:
            self._failed(e, "notify", step=n)
        return self.rv

    def _before_update(self):
        """The optimizer's pre-step hook (ipc)."""
        link = self._link
        if link is None or self.transport != "ipc":
            return
        try:
            link.before_update()
        except RvdError as e:
            self._failed(e, "notify", step=link.last_notified)
        except Exception:  # noqa: BLE001 - a bug of ours must not stop training
            if self.on_error == "raise":
                raise
            log.exception("rvd: the pre-step hook of model %s failed", self.model_id)
        else:
            if link.registered:
                self._answered()

    def _after_update(self):
        """The optimizer's post-step hook (ipc)."""
        link = self._link
        if link is not None and self.transport == "ipc" and link.registered:
            try:
                link.after_update()
            except Exception:  # noqa: BLE001 - as in _before_update
                if self.on_error == "raise":
                    raise
                log.exception("rvd: the post-step hook of model %s failed",
                              self.model_id)

    def _on_response(self, step, response):
        """A NotifyStep answer (gRPC's thread): the step's trigger, for its
        measurement whether it arrived already or not."""
        if not response.snapshot:
            return
        trigger = _IPC_TRIGGERS.get(response.reason, response.reason)
        with self._lock:
            record = self._by_step.pop(step, None)
            if record is not None:
                record.trigger = trigger
            else:
                self._reasons[step] = trigger
                for old in [s for s in self._reasons if s < step - 1000]:
                    del self._reasons[old]

    def _deliver(self, m):
        """A measurement of this model from the watch (its thread)."""
        link = self._link
        times = link.notified_at.pop(m.step, None) if link is not None else None
        record = RVMeasurement(
            rv=m.rv, per_layer_pr=dict(m.per_layer_pr), timestamp=m.timestamp,
            step=m.step if self._mode == "training" else None,
            elapsed_ms=(time.monotonic() - times[0]) * 1e3 if times else None,
            per_head_pr=dict(m.per_head_pr), sequence=m.sequence,
            trigger="", engine_ms=m.elapsed_ms,
            latency_ms=(m.timestamp - times[1]) * 1e3 if times else None,
            rvd_ms=(m.timestamp - m.notified) * 1e3 if m.notified is not None else None)
        with self._lock:  # its trigger: the answer came first, or comes later
            if self._mode == "training":
                record.trigger = self._reasons.pop(m.step, "")
                if not record.trigger:
                    self._by_step[m.step] = record
                    for old in [s for s in self._by_step if s < m.step - 1000]:
                        del self._by_step[old]
            else:
                record.trigger = "registration"
        self._record(record)
        if link is not None:
            for old in [s for s in list(link.notified_at) if s < m.step]:
                link.notified_at.pop(old, None)  # snapshots rvd did not keep

    def _deliver_proto(self, proto, trigger):
        from .types import Measurement
        m = Measurement.from_proto(proto)
        record = RVMeasurement(
            rv=m.rv, per_layer_pr=m.per_layer_pr, timestamp=m.timestamp,
            step=m.step if self._mode == "training" else None, elapsed_ms=None,
            per_head_pr=m.per_head_pr, sequence=m.sequence, trigger=trigger,
            engine_ms=m.elapsed_ms)
        self._record(record)

    def _watch_reset(self):
        """rvd restarted without its log: its sequence numbers begin again."""
        with self._lock:
            self._sequences = set()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@atexit.register
def _close_live_monitors():
    """Unregisters every live model still open when Python exits."""
    for monitor in list(_live_monitors):
        try:
            monitor.close()
        except Exception:  # noqa: BLE001 - at exit: rvd may be gone
            pass


def _same(a, b):
    """Two weight keys (tensor, storage pointer, version) are the same
    weight version (the tensor by identity: == would compare elements)."""
    return a[0] is b[0] and a[1] == b[1] and a[2] == b[2]


def _shared_gauge(prometheus_client, name, doc, labels):
    """One Gauge per name in the default registry, shared by monitors."""
    existing = getattr(prometheus_client.REGISTRY, "_names_to_collectors", {})
    if name in existing:
        return existing[name]
    return prometheus_client.Gauge(name, doc, labels)
