"""RVMonitor's ipc transport: a trainer's live V weights shared with rvd
through CUDA IPC (issue 15 sections 2-3; rvd.proto's "Live weights").

Once (RegisterLiveModel): for every monitored V parameter a LiveTensor, built
from `p.untyped_storage()._share_cuda_()` (live_tensor below): PyTorch's
handle of the allocator segment the storage lives in, as it is (kind TORCH),
the segment's size, where the tensor's element (0, 0) sits in it
(storage_offset_bytes + p.storage_offset() * element size), its strides, and
the TensorSpec the copy transport sends; the device by UUID; our pid; the
trigger policy. rvd answers with its own interprocess event Er.

Every step, the consistency rule (LIVE_DESIGN.md's "flow of one step"):
  optimizer.step()          the weights of step n are written
  after_update()            records our interprocess event Ep on the
                            current stream (an optimizer post-step hook, or
                            notify() itself)
  notify(n)                 NotifyStep(n, Ep's handle), sent without waiting
                            for the answer; rvd's stream waits on Ep, copies
                            the V set and records Er before it answers
  ... forward, backward ...
  before_update()           waits for that answer (rvd's CPU work, long done
                            by then), then makes the current stream wait on
                            Er (an optimizer pre-step hook, or notify() itself
                            when there is no optimizer): the next update
                            cannot overwrite the weights before rvd's copy
  optimizer.step()          step n + 1 ...
The trainer's CPU never waits for rvd's GPU work: Ep and Er are waited on by
streams only. Ep is one event recorded again every step, so rvd opens its
handle once; Er is opened once per registration.

The CUDA calls go through TorchCuda (one small class), so that the tests can
put a recording fake in its place; the gRPC calls go through rvd.Client.
"""
import logging
import struct
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Callable, Dict, Optional

from ._stubs import rvd_pb2
from .errors import RvdError, TransportUnavailable

log = logging.getLogger("rvd")

# PyTorch's shareable handle (c10/cuda/CUDACachingAllocator.cpp,
# shareIpcHandle): byte 0 the format version, byte 1 the type, then
# 'c' (a cudaMalloc block): the 64-byte cudaIpcMemHandle_t of the segment's
#     base;
# 'e' (an expandable segment): struct ShareHeader {pid_t pid; size_t
#     segment_size; size_t num_handles;} (24 bytes with padding), then
#     num_handles handles of the pages shared (4-byte file descriptors, or
#     64-byte fabric handles), which cover segment_size * num_handles bytes.
# rvd reads these bytes itself; here they are checked and the segment's size
# taken from them.
TORCH_HANDLE_VERSION = 2
CUDA_IPC_HANDLE_BYTES = 64
_E_HEADER = struct.Struct("<i4xQQ")
_E_HANDLE_BYTES = (4, 64)

# NotifyStep's deadline at most (seconds): the answer comes once rvd has
# enqueued its copy, and the next weight update waits for it.
NOTIFY_TIMEOUT_S = 10.0
# UnregisterLiveModel at close (seconds): rvd may be gone already.
UNREGISTER_TIMEOUT_S = 2.0
# LiveLink.answers and .notified_at keep about this many steps.
ANSWERS_KEPT = 4096


class IpcUnsupported(TransportUnavailable):
    """These weights cannot be shared with rvd through CUDA IPC."""


@dataclass(frozen=True)
class TorchHandle:
    """What the client reads of a PyTorch shareable handle."""
    type: str                     # "c" or "e"
    segment_bytes: Optional[int]  # 'e': the shared range's size; 'c': None
    producer_pid: Optional[int]   # 'e': the pid in the header


def parse_torch_handle(handle) -> TorchHandle:
    """Checks a handle of _share_cuda_ (see the format above)."""
    h = bytes(handle)
    if len(h) < 2 or h[0] != TORCH_HANDLE_VERSION:
        raise IpcUnsupported(
            f"a PyTorch IPC handle of {len(h)} bytes, version "
            f"{h[0] if h else None}: this client reads version "
            f"{TORCH_HANDLE_VERSION} (torch 2.x)")
    kind = chr(h[1])
    if kind == "c":
        if len(h) != 2 + CUDA_IPC_HANDLE_BYTES:
            raise IpcUnsupported(f"a 'c' PyTorch IPC handle of {len(h)} bytes, "
                                 f"expected {2 + CUDA_IPC_HANDLE_BYTES}")
        return TorchHandle("c", None, None)
    if kind == "e":
        if len(h) < 2 + _E_HEADER.size:
            raise IpcUnsupported(f"an 'e' PyTorch IPC handle of {len(h)} bytes "
                                 "is shorter than its header")
        pid, page, n = _E_HEADER.unpack_from(h, 2)
        rest = len(h) - 2 - _E_HEADER.size
        if n == 0 or rest not in tuple(n * b for b in _E_HANDLE_BYTES):
            raise IpcUnsupported(f"an 'e' PyTorch IPC handle with {n} handles "
                                 f"in {rest} bytes")
        return TorchHandle("e", page * n, pid)
    raise IpcUnsupported(f"a PyTorch IPC handle of type {kind!r}: rvd maps "
                         "'c' (cudaMalloc) and 'e' (expandable segment) ones")


def share_tensor(t):
    """_share_cuda_() of a CUDA tensor's storage: (device, handle,
    storage_size_bytes, storage_offset_bytes, ...). Sharing makes PyTorch
    keep the storage's memory alive until the receivers let it go."""
    return t.untyped_storage()._share_cuda_()


def segment_sizes(device) -> Dict[int, int]:
    """{segment base address: size} of the caching allocator's segments on
    a device (torch.cuda.memory_snapshot), for the 'c' handles' sizes."""
    import torch
    index = torch.device(device).index
    return {s["address"]: s["total_size"] for s in torch.cuda.memory_snapshot()
            if s.get("device") == index}


def live_tensor(spec, tensor, shared, segments=None):
    """The rvd.v1.LiveTensor of one V tensor.

    spec: its rvd.v1.TensorSpec (shape as the model holds it); tensor:
    anything with storage_offset(), element_size(), stride() and, for the
    segment lookup, untyped_storage().data_ptr(); shared: its storage's
    _share_cuda_() tuple; segments: {segment base: size}
    (segment_sizes), else the storage's end is sent as the segment's size
    (what rvd accepts when the size is not known).
    """
    _, handle, storage_bytes, storage_offset = shared[:4]
    parsed = parse_torch_handle(handle)
    rows, cols = (int(x) for x in spec.shape)
    strides = [int(s) for s in tensor.stride()]
    if len(strides) != 2 or strides[1] != 1 or strides[0] < cols:
        raise IpcUnsupported(
            f"{spec.name}: strides {tuple(strides)} of a [{rows}, {cols}] "
            "tensor; rvd reads row-major tensors, strides (ld, 1) with "
            f"ld >= {cols}")
    elem = int(tensor.element_size())
    offset = int(storage_offset) + int(tensor.storage_offset()) * elem
    end = offset + (((rows - 1) * strides[0] + cols) * elem if rows else 0)
    storage_end = int(storage_offset) + int(storage_bytes)
    if end > storage_end:
        raise IpcUnsupported(f"{spec.name}: its bytes [{offset}, {end}) run "
                             f"past its storage's end {storage_end}")
    size = parsed.segment_bytes
    if size is None and segments:
        base = tensor.untyped_storage().data_ptr() - int(storage_offset)
        size = segments.get(base)
    if size is None or size < storage_end:
        size = storage_end
    return rvd_pb2.LiveTensor(
        spec=spec, handle_kind=rvd_pb2.IPC_HANDLE_KIND_TORCH,
        handle=bytes(handle), segment_bytes=size, offset_bytes=offset,
        strides=strides)


def device_uuid(props) -> str:
    """A device's UUID as nvidia-smi prints it ("GPU-xxxxxxxx-xxxx-xxxx-
    xxxx-xxxxxxxxxxxx"), from torch.cuda.get_device_properties(dev)."""
    uuid = getattr(props, "uuid", None)
    if uuid is None:
        raise IpcUnsupported("torch.cuda.get_device_properties has no uuid: "
                             "this torch is too old for the ipc transport")
    raw = getattr(uuid, "bytes", None)
    if raw is not None and len(bytes(raw)) == 16:
        x = bytes(raw).hex()
        text = f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"
    else:
        text = str(uuid)
    return text if text.startswith(("GPU-", "MIG-")) else "GPU-" + text


class TorchCuda:
    """The CUDA calls of the ipc transport, on one device's current stream."""

    def __init__(self, device):
        import torch
        self._torch = torch
        self.device = torch.device(device)

    def new_event(self):
        with self._torch.cuda.device(self.device):
            return self._torch.cuda.Event(interprocess=True)

    def open_event(self, handle):
        return self._torch.cuda.Event.from_ipc_handle(self.device, bytes(handle))

    def record(self, event):
        event.record(self._torch.cuda.current_stream(self.device))

    def wait(self, event):
        self._torch.cuda.current_stream(self.device).wait_event(event)

    def handle(self, event):
        return bytes(event.ipc_handle())

    def synchronize(self):
        self._torch.cuda.synchronize(self.device)


class LiveLink:
    """One model's live registration with rvd, and the trainer's side of the
    ordering (the module doc). Called from the training thread only.

    client: an rvd.Client; request: the RegisterLiveModelRequest (its
    header.step is set at each registration); cuda: TorchCuda or a fake.
    Errors of rvd come out as RvdError from register(), notify() and
    before_update(); a NotFound answer to a notification (rvd restarted, or
    the registration was released) registers again first and is reported
    only if that fails.
    """

    def __init__(self, client, request, cuda, timeout=30.0):
        self.client = client
        self.request = request
        self.cuda = cuda
        self.timeout = timeout
        self.model_id = request.header.model_id
        self.registered = False
        self.response = None          # the last RegisterLiveModelResponse
        self.registrations = 0
        self._ep = None               # our event, created on first record
        self._ep_handle = b""
        self._recorded = False        # Ep recorded since the last notify
        self._er = None               # rvd's event, opened from its handle
        self._er_handle = b""
        self._pending = None          # (step, future) of the notify in flight
        self.last_notified = None     # step of the newest notify sent
        self.notified_at: Dict[int, tuple] = {}  # step -> (monotonic, wall)
        # on_response(step, NotifyStepResponse), on gRPC's thread when the
        # answer arrives (or on the caller's, when it came already).
        self.on_response: Optional[Callable] = None
        # step -> (snapshot, reason) of the newest ANSWERS_KEPT answers
        self.answers: Dict[int, tuple] = {}
        # before_register(registrations so far), before each RegisterLiveModel
        self.before_register: Optional[Callable] = None

    # ---- registration -----------------------------------------------------

    def register(self, step):
        """RegisterLiveModel with the weights as they are at `step`: the
        device is synchronized first, since rvd may read them at once
        (inference mode measures at registration)."""
        self.cuda.synchronize()
        if self.before_register is not None:
            self.before_register(self.registrations)
        self.request.header.step = int(step)
        r = self.client._unary("RegisterLiveModel", self.request, self.timeout)
        if r.rvd_event_handle != self._er_handle:
            self._er = self.cuda.open_event(r.rvd_event_handle) \
                if r.rvd_event_handle else None
            self._er_handle = r.rvd_event_handle
        self.response = r
        self.registered = True
        self.registrations += 1
        return r

    def unregister(self):
        """UnregisterLiveModel (NOT_FOUND is fine: rvd already let it go)."""
        self._pending = None
        if not self.registered:
            return
        self.registered = False
        try:
            self.client._unary("UnregisterLiveModel",
                               rvd_pb2.UnregisterLiveModelRequest(
                                   model_id=self.model_id),
                               UNREGISTER_TIMEOUT_S)
        except RvdError as e:
            if e.code_name != "NOT_FOUND":
                log.debug("rvd: unregistering %s: %s", self.model_id, e)

    # ---- the ordering -----------------------------------------------------

    def after_update(self):
        """Records Ep on the current stream: the weights are final there."""
        if self._ep is None:
            self._ep = self.cuda.new_event()
            self.cuda.record(self._ep)
            self._ep_handle = self.cuda.handle(self._ep)
        else:
            self.cuda.record(self._ep)
        self._recorded = True

    def notify(self, step, wait=False, force=False):
        """NotifyStep(step) with Ep's handle, Ep recorded now unless a
        post-step hook did since the last notify. wait: the answer is taken
        and the current stream waits on Er before this returns (no
        optimizer hooks: then every later kernel waits, not only the next
        update)."""
        self.settle()
        if not self._recorded:
            self.after_update()
        self._recorded = False
        req = rvd_pb2.NotifyStepRequest(model_id=self.model_id, step=int(step),
                                        producer_event_handle=self._ep_handle,
                                        force=force)
        self.notified_at[int(step)] = (time.monotonic(), time.time())
        self.notified_at = _newest(self.notified_at)  # none measured for long
        self.last_notified = int(step)
        stub = self.client._stub
        timeout = min(self.timeout or NOTIFY_TIMEOUT_S, NOTIFY_TIMEOUT_S)
        future = stub.NotifyStep.future(req, timeout=timeout)
        future.add_done_callback(lambda f, n=int(step): self._answered(n, f))
        self._pending = (int(step), future)
        if wait:
            self.before_update()

    def _answered(self, step, future):
        if future.cancelled() or future.exception() is not None:
            return
        r = future.result()
        self.answers[step] = (r.snapshot, r.reason)
        self.answers = _newest(self.answers)
        if self.on_response is not None:
            self.on_response(step, r)

    def settle(self):
        """Takes the answer of the notification in flight, if any."""
        if self._pending is None:
            return None
        step, future = self._pending
        self._pending = None
        import grpc
        try:
            r = future.result()
        except (grpc.RpcError, grpc.FutureCancelledError) as e:
            # cancelled: the channel was closed under it (Client.reconnect)
            error = RvdError.from_rpc(e, "NotifyStep") if isinstance(e, grpc.RpcError) \
                else RvdError(grpc.StatusCode.CANCELLED, "the channel was closed")
            self.notified_at.pop(step, None)
            if error.code_name == "NOT_FOUND":
                # rvd restarted or released us: register again (the weights
                # are those of `step` still: no update ran since), and the
                # next notified step is the first of the new registration.
                self.registered = False
                log.info("rvd: live model %s not registered at step %d (rvd "
                         "restarted or the lease ran out): registering again",
                         self.model_id, step)
                self.register(step)
                return None
            if error.code_name == "UNAVAILABLE":
                # rvd is gone: register again when it is back, and never wait
                # on an event of a process that may not record it again.
                self.registered = False
                self._er = None
                self._er_handle = b""
            raise error from None
        return r

    def before_update(self):
        """Before a weight update: the answer of the last notification, then
        the current stream waits on Er (a no-op until rvd records it). The
        wait comes even when the answer was an error: rvd may have enqueued
        its copy all the same."""
        try:
            self.settle()
        finally:
            if self._er is not None:
                self.cuda.wait(self._er)


def attach_optimizer(optimizer, before, after):
    """Registers before() as a pre-step and after() as a post-step hook of
    a torch optimizer (torch >= 2.0: register_step_pre_hook,
    register_step_post_hook), held weakly when they are bound methods (a
    dropped monitor's hooks do nothing). Returns the two hook handles."""
    if not (hasattr(optimizer, "register_step_pre_hook")
            and hasattr(optimizer, "register_step_post_hook")):
        raise TypeError(f"{type(optimizer).__name__} has no "
                        "register_step_pre_hook/register_step_post_hook "
                        "(torch >= 2.0)")
    before, after = _weak(before), _weak(after)

    def pre(opt, args, kwargs):
        fn = before()
        if fn is not None:
            fn()

    def post(opt, args, kwargs):
        fn = after()
        if fn is not None:
            fn()

    return (optimizer.register_step_pre_hook(pre),
            optimizer.register_step_post_hook(post))


class MeasurementWatch:
    """A background WatchMeasurements stream of one model: deliver(m) gets
    each rvd.Measurement after `after_sequence`, in order, on the watch's
    thread. The stream is opened again after a failure (1 s later, doubling
    to 10 s) from the last sequence delivered; OUT_OF_RANGE (an rvd without
    data_dir restarted: numbers begin again) resumes from 0 and calls
    on_reset() first. deliver is held weakly when it is a bound method, so
    that a monitor dropped by its user ends its watch."""

    def __init__(self, client, model_id, after_sequence, deliver,
                 on_reset=None):
        self.client = client
        self.model_id = model_id
        self.cursor = int(after_sequence)
        self._deliver = _weak(deliver)
        self._on_reset = _weak(on_reset) if on_reset else None
        self._stopped = threading.Event()
        self._watch = None
        self._lock = threading.Lock()
        self.ready = threading.Event()  # the first stream was opened
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"rvd-watch-{model_id}")
        self._thread.start()

    def _run(self):
        from .types import Gap
        delay = 1.0
        while not self._stopped.is_set():
            try:
                with self._lock:
                    if self._stopped.is_set():
                        return
                    self._watch = self.client.watch(self.model_id,
                                                    after_sequence=self.cursor)
                self.ready.set()
                for event in self._watch:
                    if isinstance(event, Gap):
                        log.warning("rvd: the watch of %s skipped measurements "
                                    "%d..%d (%s)", self.model_id,
                                    event.first_sequence, event.last_sequence,
                                    event.reason)
                        self.cursor = max(self.cursor, event.last_sequence)
                        continue
                    deliver = self._deliver()
                    if deliver is None:
                        return
                    self.cursor = event.sequence
                    deliver(event)
                    delay = 1.0
            except RvdError as e:
                if self._stopped.is_set():
                    return
                if e.code_name == "OUT_OF_RANGE":
                    reset = self._on_reset() if self._on_reset else None
                    if reset is not None:
                        reset()
                    self.cursor = 0
                    continue
                log.debug("rvd: the watch of %s ended (%s); again in %.0f s",
                          self.model_id, e, delay)
            except Exception:  # a bug in deliver: say it, keep watching
                log.exception("rvd: delivering a measurement of %s", self.model_id)
            if self._stopped.wait(delay):
                return
            delay = min(10.0, 2 * delay)

    def stop(self, timeout=2.0):
        with self._lock:
            self._stopped.set()
            if self._watch is not None:
                self._watch.cancel()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)


def _newest(steps):
    """A {step: ...} map, its newest ANSWERS_KEPT entries only once it has
    twice as many (amortized: one sort per ANSWERS_KEPT insertions)."""
    if len(steps) <= 2 * ANSWERS_KEPT:
        return steps
    keep = sorted(steps)[-ANSWERS_KEPT:]
    return {k: steps[k] for k in keep}


def _weak(fn):
    """A weak reference to a bound method, a strong one to a function."""
    if hasattr(fn, "__self__"):
        return weakref.WeakMethod(fn)
    return lambda: fn
