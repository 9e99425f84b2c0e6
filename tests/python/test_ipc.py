"""The ipc transport of RVMonitor without a GPU: the LiveTensors built from
PyTorch's IPC handles (offsets, strides, dtypes, fused QKV, GQA), the order
of the trainer's event, rvd's event and the weight updates (a recording
fake CUDA and optimizer), the monitor against a fake rvd with the live RPCs
(fake_live.FakeRvd: the policy step for step, restarts, unregistering), and
transport="auto" against the real CPU rvd, which refuses live weights."""
import logging
import struct
import time
import types

import grpc
import pytest
import torch

import fake_live
import models
import rvd
from fake_live import RVD_EVENT, TRAINER_EVENT, FakeCuda, FakeRvd, HookedSGD, Log
from rvd import architectures, ipc
from rvd._stubs import rvd_pb2

C_HANDLE = b"\x02c" + bytes(range(7, 71))


class Storage:
    def __init__(self, ptr):
        self.ptr = ptr

    def data_ptr(self):
        return self.ptr


class Shared:
    """A tensor as live_tensor sees it: a real CPU tensor's offset,
    strides and element size, and a storage at a made-up device address."""

    def __init__(self, t, storage_ptr):
        self.t, self.storage = t, Storage(storage_ptr)

    def storage_offset(self):
        return self.t.storage_offset()

    def stride(self):
        return self.t.stride()

    def element_size(self):
        return self.t.element_size()

    def untyped_storage(self):
        return self.storage


def spec(rows, cols, dtype=rvd_pb2.DTYPE_BF16, layout=rvd_pb2.V_LAYOUT_SEPARATE,
         geometry=(1, 1, None), name="w"):
    h, k, d = geometry
    return rvd_pb2.TensorSpec(name=name, layer=3, dtype=dtype, shape=[rows, cols],
                              layout=layout, geometry=rvd_pb2.HeadGeometry(
                                  num_heads=h, num_kv_heads=k, head_dim=d or rows))


# ---- handles and LiveTensors ----------------------------------------------------

def test_torch_handles():
    assert ipc.parse_torch_handle(C_HANDLE) == ipc.TorchHandle("c", None, None)
    # 'e': pid, the page size, the number of pages, then one 4-byte fd each
    e = b"\x02e" + struct.pack("<i4xQQ", 4242, 2 << 20, 3) + b"\0" * 12
    assert ipc.parse_torch_handle(e) == ipc.TorchHandle("e", 6 << 20, 4242)
    assert len(b"\x02e" + struct.pack("<i4xQQ", 1, 2 << 20, 1) + b"\0" * 4) == 30
    for bad, what in [(b"\x01c" + bytes(64), "version 1"),
                      (b"\x02c" + bytes(60), "62 bytes"),
                      (b"\x02x" + bytes(64), "type 'x'"),
                      (b"\x02e" + bytes(10), "shorter than its header"),
                      (b"\x02e" + struct.pack("<i4xQQ", 1, 2 << 20, 2) + b"\0" * 4,
                       "2 handles in 4 bytes"),
                      (b"", "0 bytes")]:
        with pytest.raises(ipc.IpcUnsupported, match=what):
            ipc.parse_torch_handle(bad)
    assert issubclass(ipc.IpcUnsupported, rvd.TransportUnavailable)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_live_tensor_offsets_and_segment(dtype):
    elem = torch.tensor([], dtype=dtype).element_size()
    flat = torch.zeros(5000, dtype=dtype)
    w = flat[100:100 + 32 * 64].view(32, 64)   # a view 100 elements in
    base, storage_offset = 0x7F0000000000, 2 << 20  # the storage 2 MiB into its segment
    shared = (0, C_HANDLE, 5000 * elem, storage_offset, b"", 0, b"", True)
    s = spec(32, 64)
    lt = ipc.live_tensor(s, Shared(w, base + storage_offset), shared,
                         {base: 20 << 20})
    assert lt.handle_kind == rvd_pb2.IPC_HANDLE_KIND_TORCH
    assert lt.handle == C_HANDLE and lt.spec == s
    assert lt.offset_bytes == storage_offset + 100 * elem
    assert list(lt.strides) == [64, 1]
    assert lt.segment_bytes == 20 << 20  # the allocator segment's own size
    # segment unknown: the storage's end, which holds the tensor
    lt = ipc.live_tensor(s, Shared(w, base + storage_offset), shared, {})
    assert lt.segment_bytes == storage_offset + 5000 * elem


def test_live_tensor_strides_and_bounds():
    rows_padded = torch.zeros(16, 80)[:, :64]     # ld 80 > 64: rvd takes it
    shared = (0, C_HANDLE, 16 * 80 * 4, 0, b"", 0, b"", True)
    lt = ipc.live_tensor(spec(16, 64, rvd_pb2.DTYPE_F32), Shared(rows_padded, 0), shared)
    assert list(lt.strides) == [80, 1] and lt.offset_bytes == 0
    with pytest.raises(ipc.IpcUnsupported, match=r"strides \(1, 64\).*row-major"):
        ipc.live_tensor(spec(64, 16, rvd_pb2.DTYPE_F32),
                        Shared(torch.zeros(16, 64).t(), 0), shared)
    short = (0, C_HANDLE, 100, 0, b"", 0, b"", True)  # a storage smaller than w
    with pytest.raises(ipc.IpcUnsupported, match="past its storage's end"):
        ipc.live_tensor(spec(16, 64, rvd_pb2.DTYPE_F32),
                        Shared(torch.zeros(16, 64), 0), short)
    e = b"\x02e" + struct.pack("<i4xQQ", 77, 2 << 20, 2) + b"\0" * 8
    lt = ipc.live_tensor(spec(16, 64, rvd_pb2.DTYPE_F32), Shared(torch.zeros(16, 64), 0),
                         (0, e, 4096, 512, b"", 0, b"", True))
    assert lt.segment_bytes == 4 << 20 and lt.offset_bytes == 512 and lt.handle == e


def test_device_uuid():
    u = types.SimpleNamespace(uuid=types.SimpleNamespace(bytes=bytes(range(16))))
    assert ipc.device_uuid(u) == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"

    class Text:
        def __str__(self):
            return "5a7f0b1c-0000-1111-2222-333344445555"
    assert ipc.device_uuid(types.SimpleNamespace(uuid=Text())) == \
        "GPU-5a7f0b1c-0000-1111-2222-333344445555"
    with pytest.raises(ipc.IpcUnsupported, match="no uuid"):
        ipc.device_uuid(types.SimpleNamespace())


@pytest.mark.parametrize("make,layout,geometry,shape", [
    (lambda: models.LlamaForCausalLM(layers=4, dtype=torch.bfloat16),
     rvd_pb2.V_LAYOUT_SEPARATE, (4, 2, 16), [32, 64]),                   # GQA
    (lambda: models.GPTNeoXForCausalLM(), rvd_pb2.V_LAYOUT_GPT_NEOX_QKV,
     (4, 4, 8), [96, 32]),                                               # fused QKV
    (lambda: models.GPT2LMHeadModel(), rvd_pb2.V_LAYOUT_GPT2_CONV1D,
     (4, 4, 8), [32, 96]),                                               # Conv1D
])
def test_registration_request(monkeypatch, make, layout, geometry, shape):
    """What RVMonitor registers: one LiveTensor per monitored layer, as
    stored (fused and GQA tensors whole, rvd cuts V out), the geometry,
    the policy, the device and the pid."""
    log = Log()
    fake = FakeRvd(log)
    server, address = fake_live.serve(fake)
    fake_live.install(monkeypatch, log)
    try:
        model = make()
        n = len(architectures.resolve(model).tensors)
        mon = rvd.RVMonitor(model, early_layers=[0], late_layers=[n - 1],
                            mode="training", measurement_interval=7, adaptive=True,
                            delta_threshold=0.03, per_head=True, transport="ipc",
                            address=address, model_id="reg")
        assert mon.transport == "ipc"
        (req,) = fake.registrations
        assert req.header.model_id == "reg" and req.header.step == 0
        assert list(req.header.early_layers) == [0] and \
            list(req.header.late_layers) == [n - 1] and req.header.per_head
        assert not req.header.tensors
        assert req.device_uuid == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
        import os
        assert req.producer_pid == os.getpid()
        assert req.policy == rvd_pb2.TriggerPolicy(
            mode=rvd_pb2.TriggerPolicy.MODE_TRAINING, measurement_interval=7,
            adaptive=True, delta_threshold=0.03)
        assert [t.spec.layer for t in req.tensors] == [0, n - 1]
        for t in req.tensors:
            w = mon._modules[t.spec.layer].weight
            assert t.spec.name == mon._names[t.spec.layer]
            assert list(t.spec.shape) == shape == list(w.shape)
            assert t.spec.layout == layout
            g = t.spec.geometry
            assert (g.num_heads, g.num_kv_heads, g.head_dim) == geometry
            assert list(t.strides) == list(w.stride())
            assert t.offset_bytes == 4096 + w.storage_offset() * w.element_size()
            assert t.handle[:2] == b"\x02c"
        mon.close()
        assert fake.unregistered == ["reg"]
    finally:
        server.stop(0)


# ---- the ordering, with a recording CUDA ---------------------------------------

class Future:
    def __init__(self, result=None, error=None, cancelled=False):
        self._result, self._error, self._cancelled = result, error, cancelled

    def result(self):
        if self._cancelled:
            raise grpc.FutureCancelledError()
        if self._error is not None:
            raise self._error
        return self._result

    def add_done_callback(self, fn):
        fn(self)

    def cancelled(self):
        return self._cancelled

    def exception(self):
        return self._error


class RpcError(grpc.RpcError):
    def __init__(self, code):
        self._code = code

    def code(self):
        return self._code

    def details(self):
        return f"fake {self._code.name}"


class StubClient:
    """An rvd.Client's surface that LiveLink uses, answering from lists."""

    def __init__(self, log, notify_errors=()):
        self.log = log
        self.notify_errors = list(notify_errors)
        self.registered = 0
        client = self

        class NotifyStep:
            @staticmethod
            def future(req, timeout=None):
                log.add("notify", req.step, req.producer_event_handle)
                if client.notify_errors:
                    code = client.notify_errors.pop(0)
                    if code == "cancelled":
                        return Future(cancelled=True)
                    if code is not None:
                        return Future(error=RpcError(code))
                return Future(rvd_pb2.NotifyStepResponse(snapshot=True,
                                                         reason="interval"))
        self._stub = types.SimpleNamespace(NotifyStep=NotifyStep)

    def _unary(self, method, request, timeout=None):
        self.log.add(method)
        if method == "RegisterLiveModel":
            self.registered += 1
            return rvd_pb2.RegisterLiveModelResponse(
                rvd_event_handle=RVD_EVENT if self.registered == 1 else RVD_EVENT[::-1])
        return rvd_pb2.UnregisterLiveModelResponse()


def link(log, **kw):
    request = rvd_pb2.RegisterLiveModelRequest(
        header=rvd_pb2.MeasureHeader(model_id="m"))
    client = StubClient(log, **kw)
    return ipc.LiveLink(client, request, FakeCuda(log)), client


def test_order_with_optimizer_hooks():
    """update n -> record Ep -> notify n (Ep's handle) -> ... -> the answer,
    then the stream waits on Er -> update n + 1: never an update between a
    notify and the wait on Er."""
    log = Log()
    ln, _ = link(log)
    ln.register(0)
    opt = HookedSGD([torch.nn.Parameter(torch.zeros(2))], log, lr=0.1)
    ipc.attach_optimizer(opt, ln.before_update, ln.after_update)
    del log[:]
    for n in (1, 2, 3):
        opt.step()
        ln.notify(n)
    opt.step()
    assert log == [
        ("wait", "Er"), ("update", 1), ("new_event",), ("record", "Ep"),
        ("notify", 1, TRAINER_EVENT),
        ("wait", "Er"), ("update", 2), ("record", "Ep"), ("notify", 2, TRAINER_EVENT),
        ("wait", "Er"), ("update", 3), ("record", "Ep"), ("notify", 3, TRAINER_EVENT),
        ("wait", "Er"), ("update", 4), ("record", "Ep")]


def check_order(log):
    """The consistency rule over a log: after each notify, the wait on Er
    comes before the next update; each notify follows a record of Ep."""
    waiting, recorded = False, False
    for entry in log:
        if entry[0] == "record":
            recorded = True
        elif entry[0] == "notify":
            assert recorded, f"notify {entry[1]} without a record of Ep first"
            recorded, waiting = False, True
        elif entry[0] == "wait":
            waiting = False
        elif entry[0] == "update":
            assert not waiting, f"update {entry[1]} before the wait on rvd's event"


def test_order_without_optimizer():
    """No hooks: step() records, notifies, takes the answer and makes the
    stream wait on Er before it returns."""
    log = Log()
    ln, _ = link(log)
    ln.register(0)
    del log[:]
    for n in (1, 2):
        log.add("update", n)
        ln.notify(n, wait=True)
    assert log == [("update", 1), ("new_event",), ("record", "Ep"),
                   ("notify", 1, TRAINER_EVENT), ("wait", "Er"),
                   ("update", 2), ("record", "Ep"), ("notify", 2, TRAINER_EVENT),
                   ("wait", "Er")]
    check_order(log)


def test_check_order_catches_a_missing_wait(monkeypatch):
    """The mutant: before_update without its wait on Er."""
    log = Log()
    ln, _ = link(log)
    ln.register(0)
    monkeypatch.setattr(ln, "before_update", ln.settle)
    opt = HookedSGD([torch.nn.Parameter(torch.zeros(2))], log, lr=0.1)
    ipc.attach_optimizer(opt, ln.before_update, ln.after_update)
    opt.step()
    ln.notify(1)
    opt.step()
    with pytest.raises(AssertionError, match="update 2 before the wait"):
        check_order(log)


def test_notify_errors():
    log = Log()
    ln, client = link(log, notify_errors=[grpc.StatusCode.NOT_FOUND,
                                          grpc.StatusCode.DEADLINE_EXCEEDED,
                                          "cancelled",
                                          grpc.StatusCode.UNAVAILABLE])
    ln.register(0)
    assert ln.registered and ("open_event", RVD_EVENT) in log
    # NOT_FOUND (rvd restarted): registered again at the notified step, a new
    # Er opened, and the wait is on it; nothing is raised.
    ln.notify(1)
    del log[:]
    ln.before_update()
    assert log == [("synchronize",), ("RegisterLiveModel",),
                   ("open_event", RVD_EVENT[::-1]), ("wait", "Er")]
    assert ln.request.header.step == 1 and ln.registrations == 2
    # DEADLINE_EXCEEDED: raised, the registration kept, and still the wait
    # (rvd may have enqueued its copy)
    ln.notify(2)
    del log[:]
    with pytest.raises(rvd.RvdError, match="DEADLINE_EXCEEDED"):
        ln.before_update()
    assert log == [("wait", "Er")] and ln.registered
    # cancelled under it (the channel closed by Client.reconnect): an RvdError
    ln.notify(3)
    del log[:]
    with pytest.raises(rvd.RvdError, match="CANCELLED"):
        ln.before_update()
    assert log == [("wait", "Er")] and ln.registered
    # UNAVAILABLE: rvd is gone; no wait on its event from now on
    ln.notify(4)
    del log[:]
    with pytest.raises(rvd.RvdError, match="UNAVAILABLE"):
        ln.before_update()
    assert log == [] and not ln.registered
    ln.before_update()
    assert log == []
    ln.unregister()  # not registered: nothing sent
    assert ("UnregisterLiveModel",) not in log


# ---- RVMonitor against the fake rvd ------------------------------------------------

@pytest.fixture
def fake_rvd(monkeypatch):
    log = Log()
    fake = FakeRvd(log)
    server, address = fake_live.serve(fake)
    fake_live.install(monkeypatch, log)
    fake.address = address
    yield fake
    server.stop(0)


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def expected_steps(steps, interval, adaptive, deltas, threshold, first=1):
    """rvd.proto's TriggerPolicy: the first notified step, then interval
    steps after the last measured one, or a delta above the threshold."""
    got, last = [], None
    for s in range(first, steps + 1):
        if last is None or s - last >= interval or \
                (adaptive and deltas.get(s, 0.0) > threshold):
            got.append(s)
            last = s
    return got


@pytest.mark.parametrize("with_optimizer", [True, False])
def test_monitor_training_follows_rvd(fake_rvd, with_optimizer):
    deltas = {3: 0.5, 4: 0.001, 9: 0.2}
    fake_rvd.deltas = deltas
    model = models.LlamaForCausalLM()
    log = fake_rvd.log
    opt = HookedSGD(model.parameters(), log, lr=0.01)
    mon = rvd.RVMonitor(model, early_layers=[0, 1], late_layers=[4, 5],
                        mode="training", measurement_interval=5, adaptive=True,
                        delta_threshold=0.1, transport="ipc", on_error="raise",
                        address=fake_rvd.address,
                        optimizer=opt if with_optimizer else None)
    assert mon.rv is None and mon.history == []  # nothing measured at registration
    for _ in range(12):
        opt.zero_grad()
        model(torch.randn(2, 64)).mean().backward()
        opt.step()
        mon.step()
    want = expected_steps(12, 5, True, deltas, 0.1)
    assert want == [1, 3, 8, 9]
    assert wait_for(lambda: len(mon.history) == len(want))
    assert [r.step for r in mon.history] == want
    assert wait_for(lambda: all(r.trigger for r in mon.history))
    assert [r.trigger for r in mon.history] == ["first", "delta", "interval", "delta"]
    for r in mon.history:
        assert r.rv == r.step and r.per_layer_pr[4] == r.step + 0.04
        assert r.latency_ms is not None and r.latency_ms >= 0
        assert r.rvd_ms is not None and 0 <= r.rvd_ms <= r.latency_ms
        assert r.elapsed_ms is not None and r.sequence > 0
    assert mon.rv == 9.0
    assert wait_for(lambda: sum(e[0] == "notify" for e in log) == 12)  # 12: in flight
    notified = [e[1] for e in log if e[0] == "notify"]
    assert notified == list(range(1, 13))
    assert {e[2] for e in log if e[0] == "notify"} == {TRAINER_EVENT}
    assert [e for e in log if e[0] == "open_event"] == [("open_event", RVD_EVENT)]
    check_order(log)
    if with_optimizer:  # the post-hook records, step() does not again
        assert sum(e[0] == "record" for e in log) == 12
    mon.close()
    assert fake_rvd.unregistered == [mon.model_id]
    mon.close()
    assert fake_rvd.unregistered == [mon.model_id]


def test_monitor_inference_mode(fake_rvd):
    model = models.LlamaForCausalLM()
    mon = rvd.RVMonitor(model, transport="ipc", address=fake_rvd.address)
    assert mon.rv == 0.0 and [(r.step, r.trigger) for r in mon.history] == \
        [(None, "registration")]
    for _ in range(3):
        assert mon.step() == 0.0
    assert not [e for e in fake_rvd.log if e[0] == "notify"]
    time.sleep(0.2)  # the watch delivers the same sequence: kept once
    assert len(mon.history) == 1
    # measure_now: the weights as they are, by copy (the fake has no Measure)
    with pytest.raises(rvd.RvdError, match="UNIMPLEMENTED"):
        mon.on_error = "raise"
        mon.measure_now()
    mon.close()


def test_monitor_reregisters_after_rvd_restart(fake_rvd, caplog):
    model = models.LlamaForCausalLM()
    opt = HookedSGD(model.parameters(), fake_rvd.log, lr=0.01)
    mon = rvd.RVMonitor(model, mode="training", measurement_interval=3,
                        transport="ipc", address=fake_rvd.address, optimizer=opt,
                        on_error="raise")

    def train():
        opt.zero_grad()
        model(torch.randn(2, 64)).mean().backward()
        opt.step()
        mon.step()

    with caplog.at_level(logging.INFO, logger="rvd"):
        for _ in range(4):
            train()
        assert wait_for(lambda: ("notify", 4, TRAINER_EVENT) in fake_rvd.log)
        fake_rvd.forget(mon.model_id)   # rvd restarted
        for _ in range(4):
            train()                      # notify 5 -> NOT_FOUND -> registered again
    assert "registering again" in caplog.text
    assert [r.header.step for r in fake_rvd.registrations] == [0, 5]
    # the new registration's first notified step (6) is measured first
    assert wait_for(lambda: [r.step for r in mon.history] == [1, 4, 6])
    assert [e[2] for e in fake_rvd.log if e[0] == "notify" and e[1] == 5] == ["NOT_FOUND"]
    mon.close()


def test_monitor_rvd_down_then_up(monkeypatch):
    """transport="ipc" with rvd unreachable at start: warn, then register
    once rvd answers (at most once a second), and measure from there."""
    log = Log()
    fake_live.install(monkeypatch, log)
    from rvdtest import free_port
    port = free_port()
    model = models.LlamaForCausalLM()
    mon = rvd.RVMonitor(model, mode="training", measurement_interval=2,
                        transport="ipc", address=f"127.0.0.1:{port}", timeout=2)
    assert mon.transport == "ipc" and [c for _, _, c in mon.skipped] == ["UNAVAILABLE"]
    mon.step()  # within the pause: nothing tried
    assert len(mon.skipped) == 1
    fake = FakeRvd(log)
    import grpc as _grpc
    from concurrent import futures
    server = _grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    fake_live.rvd_pb2_grpc.add_RvdServicer_to_server(fake, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        mon._paused_until = 0.0  # as if the pause were over
        mon.step()                # step 2: registers
        assert [r.header.step for r in fake.registrations] == [2]
        for _ in range(3):
            mon.step()            # 3, 4, 5: 3 first, 5 interval
        assert wait_for(lambda: [r.step for r in mon.history] == [3, 5])
        mon.close()
    finally:
        server.stop(0)


def test_ipc_needs_cuda_weights(daemon):
    model = models.LlamaForCausalLM()
    with pytest.raises(rvd.TransportUnavailable, match=r"one CUDA device.*\['cpu'\]"):
        rvd.RVMonitor(model, address=daemon.grpc_address, transport="ipc")
    m = rvd.RVMonitor(model.double(), address=daemon.grpc_address)
    assert m.transport == "copy"


# ---- transport="auto" against the real (CPU) rvd -----------------------------------

def test_auto_falls_back_to_copy_on_the_cpu_rvd(daemon, monkeypatch, caplog):
    """rvd without a GPU answers RegisterLiveModel with FAILED_PRECONDITION
    (or UNIMPLEMENTED, an rvd without the live API): auto measures by copy,
    said once; ipc raises TransportUnavailable with rvd's answer."""
    log = Log()
    fake_live.install(monkeypatch, log)
    model = models.LlamaForCausalLM()
    with caplog.at_level(logging.WARNING, logger="rvd"):
        mon = rvd.RVMonitor(model, mode="training", measurement_interval=2,
                            address=daemon.grpc_address, transport="auto")
        assert mon.transport == "copy"
        assert [r.trigger for r in mon.history] == ["registration"]
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for _ in range(4):
            opt.zero_grad()
            model(torch.randn(2, 64)).mean().backward()
            opt.step()
            mon.step()
    assert [r.step for r in mon.history] == [0, 2, 4]
    refusals = [r for r in caplog.records if "does not take live weights" in r.message]
    assert len(refusals) == 1
    assert any(c in refusals[0].message for c in ("FAILED_PRECONDITION", "UNIMPLEMENTED"))
    with pytest.raises(rvd.TransportUnavailable,
                       match="FAILED_PRECONDITION|UNIMPLEMENTED") as e:
        rvd.RVMonitor(model, address=daemon.grpc_address, transport="ipc")
    assert isinstance(e.value.__cause__, rvd.RvdError)
    mon.close()


# ---- the GPU tests' harness, on CPU against a fake rvd that reads the weights -----

@pytest.mark.parametrize("stale", [False, True])
def test_gpu_harness_on_cpu(monkeypatch, stale):
    """tests/python/gpu/test_ipc_cuda.py's train() with live_check's
    LiveChecker and PolicyOracle, against FakeRvd(real=True) (float64
    snapshots of the CPU weights at each notification): exact and on policy
    step for step; a fake that measures the previous notification's
    weights (stale) is caught."""
    import pathlib
    import sys
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "gpu"))
    import test_ipc_cuda as g
    from live_check import PolicyOracle
    log = Log()
    fake = FakeRvd(log, real=True)
    fake.stale = stale
    server, address = fake_live.serve(fake)
    fake_live.install(monkeypatch, log)
    try:
        torch.manual_seed(0)
        model = models.LlamaForCausalLM(layers=g.LAYERS, heads=g.HEADS, kv_heads=g.KV,
                                        hidden=g.HIDDEN)
        opt = fake_live.HookedAdamW(model.parameters(), log, lr=1e-5)
        interval, threshold = 5, 0.08
        mon = rvd.RVMonitor(model, early_layers=g.EARLY, late_layers=g.LATE,
                            mode="training", measurement_interval=interval,
                            adaptive=True, delta_threshold=threshold, per_head=True,
                            transport="ipc", on_error="raise", address=address,
                            optimizer=opt)
        policy = PolicyOracle(interval, True, threshold)
        checker, decisions = g.train(model, mon, opt, 24,
                                     lambda n: 1e-6 if n <= 12 else 1e-3, policy=policy)
        mon.close()
    finally:
        server.stop(0)
    if stale:
        assert checker.failures
        return
    assert not checker.failures, checker.failures[:5]
    assert checker.worst <= 1e-9 and checker.checked == len(mon.history)
    assert checker.oracle_vs_svd is not None and checker.oracle_vs_svd < 1e-10
    assert not [d for d in decisions if d[1] != d[3] and not d[2]], decisions
    measured = [d[0] for d in decisions if d[3]]
    assert [r.step for r in mon.history] == measured
    assert {"first", "interval", "delta"} <= {r.trigger for r in mon.history}, \
        [(r.step, r.trigger) for r in mon.history]


def test_rvd_gone_and_back_on_cpu(monkeypatch, caplog):
    """The GPU test of an rvd killed mid-training, here against fake rvds
    on one port: the trainer goes on while none answers (warnings, no
    waits on the dead rvd's event), then registers with the next one and
    its measurements (read from the weights) are exact."""
    import pathlib
    import sys
    from concurrent import futures
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "gpu"))
    import test_ipc_cuda as g
    from rvdtest import free_port
    log = Log()
    fake_live.install(monkeypatch, log)
    port = free_port()

    def serve_on_port():
        fake = FakeRvd(log, real=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        fake_live.rvd_pb2_grpc.add_RvdServicer_to_server(fake, server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        return fake, server

    first, server = serve_on_port()
    torch.manual_seed(1)
    model = models.LlamaForCausalLM(layers=g.LAYERS, heads=g.HEADS, kv_heads=g.KV,
                                    hidden=g.HIDDEN)
    opt = fake_live.HookedAdamW(model.parameters(), log, lr=1e-4)
    mon = rvd.RVMonitor(model, early_layers=g.EARLY, late_layers=g.LATE,
                        mode="training", measurement_interval=2, transport="ipc",
                        per_head=True,
                        address=f"127.0.0.1:{port}", optimizer=opt, timeout=5)
    try:
        checker, _ = g.train(model, mon, opt, 6, lambda n: 1e-4, last_measured=5)
        assert not checker.failures and [r.step for r in mon.history] == [1, 3, 5]
        server.stop(0)
        with caplog.at_level(logging.WARNING, logger="rvd"):
            g.train(model, mon, opt, 4, lambda n: 1e-4)
        assert "UNAVAILABLE" in caplog.text and not mon._link.registered
        waits = sum(e == ("wait", "Er") for e in log)
        second, server = serve_on_port()
        # the monitor's channel out of its reconnect backoff, and its pause over
        grpc.channel_ready_future(mon.client._channel).result(timeout=10)
        mon._paused_until = 0.0
        checker, _ = g.train(model, mon, opt, 8, lambda n: 1e-4, last_measured=8)
        assert mon._link.registered and mon._link.registrations == 2
        assert [r.header.step for r in second.registrations] == [11]
        assert not checker.failures, checker.failures[:5]
        assert [r.step for r in mon.history][3:] == [12, 14, 16, 18]
        assert waits > 0 and sum(e == ("wait", "Er") for e in log) > waits
    finally:
        mon.close()
        server.stop(0)


@pytest.mark.parametrize("code", [grpc.StatusCode.PERMISSION_DENIED,
                                  grpc.StatusCode.INVALID_ARGUMENT,
                                  grpc.StatusCode.ALREADY_EXISTS])
def test_registration_refused(monkeypatch, caplog, code):
    """rvd refuses the weights: "ipc" raises TransportUnavailable with rvd's
    code and message (PERMISSION_DENIED: an expandable segment's
    descriptors); "auto" measures by copy (logged); ALREADY_EXISTS (another
    producer's model id) is no reason for copy: it follows on_error."""
    log = Log()
    fake = FakeRvd(log, refuse=code)
    server, address = fake_live.serve(fake)
    fake_live.install(monkeypatch, log)
    try:
        model = models.LlamaForCausalLM()
        if code == grpc.StatusCode.ALREADY_EXISTS:
            with pytest.raises(rvd.RvdError, match="ALREADY_EXISTS"):
                rvd.RVMonitor(model, transport="auto", address=address, on_error="raise")
            mon = rvd.RVMonitor(model, transport="auto", address=address,
                                mode="training")
            assert mon.transport == "ipc" and [c for _, _, c in mon.skipped] == \
                ["ALREADY_EXISTS"]
            mon.close()
            return
        with pytest.raises(rvd.TransportUnavailable, match=f"{code.name}: fake rvd"):
            rvd.RVMonitor(model, transport="ipc", address=address)
        with caplog.at_level(logging.WARNING, logger="rvd"):
            mon = rvd.RVMonitor(model, transport="auto", address=address)
        assert mon.transport == "copy" and code.name in caplog.text
        # the fake has no Measure: the copy measurement was tried and skipped
        assert [c for _, _, c in mon.skipped] == ["UNIMPLEMENTED"]
        mon.close()
    finally:
        server.stop(0)


@pytest.mark.parametrize("broken", [False, True])
def test_write_right_after_notify_on_cpu(monkeypatch, broken):
    """The GPU tests' consistency check against FakeRvd(real=True), which
    reads the weights when it handles the notification (as rvd's copy runs
    when its stream gets there): the optimizer stepping again right after
    notifying still leaves every measurement exact, since the pre-step
    hook takes rvd's answer first; without that hook the same check
    catches the writes in the snapshots."""
    import pathlib
    import sys
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "gpu"))
    import test_ipc_cuda as g
    log = Log()
    fake = FakeRvd(log, real=True)
    server, address = fake_live.serve(fake)
    fake_live.install(monkeypatch, log)
    try:
        torch.manual_seed(2)
        model = models.LlamaForCausalLM(layers=g.LAYERS, heads=g.HEADS, kv_heads=g.KV,
                                        hidden=g.HIDDEN)
        opt = fake_live.HookedAdamW(model.parameters(), log, lr=3e-3)
        mon = rvd.RVMonitor(model, early_layers=g.EARLY, late_layers=g.LATE,
                            mode="training", measurement_interval=1, per_head=True,
                            transport="ipc", on_error="raise", address=address,
                            optimizer=opt)
        if broken:
            mon._hooks[0].remove()
        checker, _ = g.train(model, mon, opt, 8, lambda n: 3e-3,
                             write_after_notify=True, last_measured=8)
        mon.close()
    finally:
        server.stop(0)
    assert [r.step for r in mon.history] == list(range(1, 9))
    if broken:
        assert checker.failures
    else:
        assert not checker.failures, checker.failures[:5]


def test_exports_while_the_watch_appends(fake_rvd, tmp_path):
    """ipc: history, exports and summary while measurements arrive on the
    watch's thread (they read a copy taken under the monitor's lock)."""
    model = models.LlamaForCausalLM()
    mon = rvd.RVMonitor(model, mode="training", measurement_interval=1,
                        transport="ipc", address=fake_rvd.address, history_maxlen=5)
    for n in range(1, 40):
        mon.step()
        mon.export_json(tmp_path / "h.json")
        mon.export_csv(tmp_path / "h.csv")
        assert "RVMonitor" in mon.summary()
    assert wait_for(lambda: mon.history and mon.history[-1].step == 39)
    import json
    mon.export_json(tmp_path / "h.json")
    doc = json.loads((tmp_path / "h.json").read_text())
    assert [h["step"] for h in doc["history"]] == list(range(35, 40))
    assert doc["measurements"] == 39
    mon.close()
