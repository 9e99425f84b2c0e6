"""Fakes for the ipc transport's CPU tests: a recording CUDA (events and
streams as log entries), PyTorch's _share_cuda_ for CPU tensors, an
optimizer with torch 2's step hooks, and a small rvd that speaks the live
RPCs (RegisterLiveModel, NotifyStep, UnregisterLiveModel, GetLatest,
WatchMeasurements) with the TriggerPolicy of rvd.proto, its measurements
made up from the step (rv = step, PR of layer l = step + l / 100), since it
cannot read the trainer's memory. The real rvd is tested on the GPU host
(tests/python/gpu)."""
import itertools
import math
import threading
import types
from concurrent import futures

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
import torch

from rvd._stubs import rvd_pb2, rvd_pb2_grpc

RVD_EVENT = bytes(range(64))
TRAINER_EVENT = bytes(range(64, 128))


class Log(list):
    """Entries appended from several threads, in order."""

    def __init__(self):
        super().__init__()
        self.lock = threading.Lock()

    def add(self, *entry):
        with self.lock:
            self.append(entry)


class Event:
    def __init__(self, name, handle=b""):
        self.name, self.handle = name, handle


class FakeCuda:
    """ipc.TorchCuda's interface; every call a log entry."""

    def __init__(self, log):
        self.log = log
        self.device = torch.device("cpu")

    def new_event(self):
        self.log.add("new_event")
        return Event("Ep", TRAINER_EVENT)

    def open_event(self, handle):
        self.log.add("open_event", bytes(handle))
        return Event("Er", bytes(handle))

    def record(self, event):
        self.log.add("record", event.name)

    def wait(self, event):
        self.log.add("wait", event.name)

    def handle(self, event):
        return event.handle

    def synchronize(self):
        self.log.add("synchronize")


# handle -> the tensor it was made for, so that FakeRvd(real=True) can read
# the "shared" memory as rvd reads the trainer's.
HANDLES = {}
_handles = itertools.count(1)


def fake_share(t):
    """_share_cuda_()'s tuple for a CPU tensor: a 'c' handle of its own."""
    elem = t.element_size()
    storage_bytes = (t.storage_offset() + t.numel()) * elem
    handle = b"\x02c" + next(_handles).to_bytes(64, "little")
    HANDLES[handle] = t
    return (0, handle, storage_bytes, 4096, b"", 0, b"", True)


def install(monkeypatch, log):
    """Makes RVMonitor take CPU weights for CUDA ones (the ipc transport's
    CUDA parts replaced by the fakes above)."""
    import rvd.ipc
    import rvd.monitor
    monkeypatch.setattr(rvd.monitor.RVMonitor, "_ipc_device",
                        lambda self: torch.device("cpu"))
    monkeypatch.setattr(rvd.ipc, "share_tensor", fake_share)
    monkeypatch.setattr(rvd.ipc, "segment_sizes", lambda device: {})
    monkeypatch.setattr(rvd.ipc, "TorchCuda", lambda device: FakeCuda(log))
    monkeypatch.setattr(rvd.monitor.torch.cuda, "get_device_properties",
                        lambda device: types.SimpleNamespace(
                            uuid=types.SimpleNamespace(bytes=bytes(range(16)))))


class _Hooked:
    """An optimizer with torch 2's register_step_pre_hook /
    register_step_post_hook (Debian's torch 1.13 has neither); step() logs
    ("update", n)."""

    def __init__(self, params, log, **kw):
        super().__init__(params, **kw)
        self.log, self.updates = log, 0
        self._pre, self._post = {}, {}

    def _register(self, table, hook):
        key = object()
        table[key] = hook
        return types.SimpleNamespace(remove=lambda: table.pop(key, None))

    def register_step_pre_hook(self, hook):
        return self._register(self._pre, hook)

    def register_step_post_hook(self, hook):
        return self._register(self._post, hook)

    def step(self, closure=None):
        for h in list(self._pre.values()):
            h(self, (), {})
        self.updates += 1
        self.log.add("update", self.updates)
        out = super().step(closure)
        for h in list(self._post.values()):
            h(self, (), {})
        return out


class HookedSGD(_Hooked, torch.optim.SGD):
    pass


class HookedAdamW(_Hooked, torch.optim.AdamW):
    pass


class FakeRvd(rvd_pb2_grpc.RvdServicer):
    """rvd's live RPCs as rvd.proto states them (see the module doc).
    deltas: {step: the delta rvd would compute at that step} for adaptive
    policies (0 where missing). refuse: a grpc.StatusCode RegisterLiveModel
    answers with, e.g. FAILED_PRECONDITION."""

    def __init__(self, log=None, deltas=None, refuse=None, real=False):
        self.log = log if log is not None else Log()
        self.real = real         # measure the tensors behind the handles
        self.last_snapshot = {}  # real: model_id -> {layer: float64 copy}
        self.deltas = deltas or {}
        self.refuse = refuse
        self.lock = threading.Condition()
        self.live = {}           # model_id -> (request, last notified, last measured)
        self.measurements = []   # rvd_pb2.Measurement, in sequence order
        self.registrations = []  # requests
        self.unregistered = []
        self.answers = {}        # (model_id, step) -> NotifyStepResponse
        self.sequence = 0

    stale = False  # a broken rvd: each snapshot is the previous notification's

    def _snapshot(self, request):
        now = {t.spec.layer: HANDLES[t.handle].detach().double().clone()
               for t in request.tensors}
        if not self.stale:
            return now
        before, self._previous = getattr(self, "_previous", now), now
        return before

    def _delta(self, request, snapshot):
        last = self.last_snapshot.get(request.header.model_id)
        num = sum(float(((snapshot[l] - last[l]) ** 2).sum()) for l in snapshot)
        den = sum(float((last[l] ** 2).sum()) for l in snapshot)
        return math.sqrt(num / den) if den else math.inf

    def _measure(self, request, step, snapshot=None):
        notified = Timestamp()
        notified.GetCurrentTime()  # as rvd: its receipt of the notification
        layers = [t.spec.layer for t in request.tensors]
        self.sequence += 1
        if snapshot is None:
            m = rvd_pb2.Measurement(
                model_id=request.header.model_id, step=step, rv=float(step),
                layers=[rvd_pb2.LayerPR(layer=l, pr=step + l / 100) for l in layers])
        else:
            def pr(x):
                s2 = torch.linalg.eigvalsh(x @ x.T if x.shape[0] <= x.shape[1]
                                           else x.T @ x).clamp_min(0)
                return float(s2.sum() ** 2 / (s2 * s2).sum())
            m = rvd_pb2.Measurement(model_id=request.header.model_id, step=step)
            prs = {}
            for t in request.tensors:
                x, d = snapshot[t.spec.layer], t.spec.geometry.head_dim
                prs[t.spec.layer] = pr(x)
                heads = [pr(x[h * d:(h + 1) * d]) for h in range(x.shape[0] // d)] \
                    if request.header.per_head else []
                m.layers.add(layer=t.spec.layer, pr=prs[t.spec.layer], head_pr=heads)
            early, late = request.header.early_layers, request.header.late_layers
            if early and late:
                def g(ls):
                    return math.exp(sum(math.log(prs[l]) for l in ls) / len(ls))
                m.rv = g(late) / g(early)
            self.last_snapshot[request.header.model_id] = snapshot
        m.backend, m.sequence, m.elapsed_ms = "fake", self.sequence, 0.5
        m.notified.CopyFrom(notified)
        m.timestamp.GetCurrentTime()
        self.measurements.append(m)
        self.lock.notify_all()
        return m

    def RegisterLiveModel(self, request, context):
        self.log.add("register", request.header.step)
        if self.refuse is not None:
            context.abort(self.refuse, "fake rvd: no live models here")
        with self.lock:
            self.registrations.append(request)
            r = rvd_pb2.RegisterLiveModelResponse(
                rvd_event_handle=RVD_EVENT, segments_mapped=len(request.tensors),
                lease_seconds=60)
            if request.policy.mode == rvd_pb2.TriggerPolicy.MODE_INFERENCE:
                r.measurement.CopyFrom(self._measure(
                    request, request.header.step,
                    self._snapshot(request) if self.real else None))
            self.live[request.header.model_id] = [request, None, None]
            return r

    def UnregisterLiveModel(self, request, context):
        with self.lock:
            self.unregistered.append(request.model_id)
            if self.live.pop(request.model_id, None) is None:
                context.abort(grpc.StatusCode.NOT_FOUND, "not live")
        return rvd_pb2.UnregisterLiveModelResponse()

    def forget(self, model_id):
        """As a restarted rvd: the registration is gone."""
        with self.lock:
            self.live.pop(model_id, None)

    def NotifyStep(self, request, context):
        with self.lock:
            entry = self.live.get(request.model_id)
            if entry is None:
                self.log.add("notify", request.step, "NOT_FOUND")
                context.abort(grpc.StatusCode.NOT_FOUND, "not registered")
            reg, last, measured = entry
            if last is not None and request.step <= last:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "step not above")
            entry[1] = request.step
            p = reg.policy
            interval = p.measurement_interval or 100
            threshold = p.delta_threshold or 0.01
            if request.force:
                snapshot, reason, measure = True, "forced", True
            elif p.mode == rvd_pb2.TriggerPolicy.MODE_INFERENCE:
                snapshot, reason, measure = False, "inference", False
            elif measured is None:
                snapshot, reason, measure = True, "first", True
            elif request.step - measured >= interval:
                snapshot, reason, measure = True, "interval", True
            elif p.adaptive:
                snapshot, reason, measure = True, "adaptive_check", None
            else:
                snapshot, reason, measure = False, "skipped", False
            copy = self._snapshot(reg) if snapshot and self.real else None
            if measure is None:
                delta = self._delta(reg, copy) if self.real \
                    else self.deltas.get(request.step, 0.0)
                measure = delta > threshold
            if measure:
                entry[2] = request.step
                self._measure(reg, request.step, copy)
            r = rvd_pb2.NotifyStepResponse(snapshot=snapshot, reason=reason,
                                           last_sequence=self.sequence)
            self.answers[(request.model_id, request.step)] = r
            self.log.add("notify", request.step, bytes(request.producer_event_handle))
            return r

    def GetLatest(self, request, context):
        with self.lock:
            mine = [m for m in self.measurements if m.model_id == request.model_id]
        if not mine:
            context.abort(grpc.StatusCode.NOT_FOUND, "no measurement")
        return mine[-1]

    def GetHistory(self, request, context):
        with self.lock:
            mine = [m for m in self.measurements if m.model_id == request.model_id]
        if request.limit:
            mine = mine[-request.limit:]
        return rvd_pb2.GetHistoryResponse(measurements=mine)

    def WatchMeasurements(self, request, context):
        after = request.after_sequence if request.HasField("after_sequence") \
            else self.sequence
        while context.is_active():
            with self.lock:
                new = [m for m in self.measurements if m.sequence > after and
                       (not request.model_id or m.model_id == request.model_id)]
                if not new:
                    self.lock.wait(0.05)
                    continue
            for m in new:
                after = m.sequence
                yield rvd_pb2.WatchEvent(measurement=m)


def serve(servicer):
    """(server, address) of a servicer on a free loopback port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    rvd_pb2_grpc.add_RvdServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"
