"""VActivationMonitor: seed 000's activation statistics, computed by rvd.

    mon = rvd.VActivationMonitor(model, layer_indices=[0, 8, 16, 24])
    with torch.no_grad():
        model(**inputs)
    for s in mon.activation_stats:
        print(s.layer_idx, s.effective_rank, s.frobenius_norm)

What it looks at: the V activations (the output of the V projection, the
tensor attention reads V from, not the weight) of each chosen layer. A
forward hook on the layer's V module, found as RVMonitor finds it
(config/architectures.yaml through architectures.resolve: v_proj, or a
fused QKV module), records its output on each forward pass; for a fused
module the V features are cut out of the output by the layout and head
geometry, as rvd cuts V out of the weight:
  separate            every feature ([..., K*d])
  phi3_qkv            features (H + K)*d .. (H + 2K)*d
  gpt_neox_qkv,       per head h the last d of its 3*d features
  falcon_classic
  falcon_multi_query  features (H + 1)*d .. (H + 2)*d
  falcon_grouped      per kv group the last d of its (H/K + 2)*d features
  gpt2_conv1d         features 2*D .. 3*D
Every leading dimension is a token: the matrix is (batch x sequence) x
features, sent as stored (f32, f16, bf16; f64 as f32).

When it computes: reading activation_stats (or calling measure()) sends
the newest forward pass's activations to rvd in MeasureActivations calls
(copy transport, at most ~15 MiB per call) and caches the answer until the
next forward pass, which replaces them. The activations of a pass are held
(a copy on their device) until then.

What rvd computes (server/activations.h): the eigenvalues of the Gram of
the matrix's smaller side in float64 (the squared singular values s_i),
then frobenius_norm = sqrt(sum s_i^2), max_singular_value = s_1,
entropy H = -sum p_i log p_i of p_i = s_i / sum s_j, effective_rank =
exp(H) (Roy and Vetterli 2007), participation_ratio = (sum s_i^2)^2 /
sum s_i^4; a zero matrix has all of them 0. The smaller side is at most
4096 (max_tokens= cuts the tokens to fit).

Without hooks (and without torch, for numpy arrays):
activation_stats(client, model_id, {layer: matrix}) -> [ActivationStats].

When rvd fails: on_error="warn" (default) logs, keeps the error in
.last_error and answers []; on_error="raise" raises rvd.RvdError.
"""
import itertools
import logging
import os
import re
from dataclasses import dataclass
from typing import List, Optional

from ._stubs import rvd_pb2
from .client import Client, MAX_REQUEST_MESSAGE_BYTES
from .errors import RvdError

log = logging.getLogger("rvd")

# Tensor bytes per MeasureActivations call: rvd takes messages of up to
# MAX_REQUEST_MESSAGE_BYTES; the rest is room for the message's framing.
CALL_MAX_BYTES = MAX_REQUEST_MESSAGE_BYTES - (1 << 20)
# server/activations.h kMaxActivationSide: the smaller side's limit.
MAX_SIDE = 4096

_ids = itertools.count(1)


@dataclass(frozen=True)
class ActivationStats:
    """One layer's V activation statistics from one forward pass."""
    layer_idx: int
    effective_rank: float
    frobenius_norm: float
    max_singular_value: float
    entropy: float
    participation_ratio: float
    tokens: int = 0    # rows of the matrix sent
    features: int = 0  # its columns


def v_features(output, layout, geometry):
    """The V part of a V module's output (last dimension: its features),
    as a 2-D tokens x features tensor (see the module doc)."""
    import torch

    x = output[0] if isinstance(output, (tuple, list)) else output
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"the V module returned {type(x).__name__}, not a tensor")
    f = x.shape[-1]
    x = x.reshape(-1, f)
    if layout == "separate":
        return x
    if layout == "gpt2_conv1d":
        if f % 3:
            raise ValueError(f"gpt2 c_attn output of {f} features is not Q | K | V")
        return x[:, 2 * f // 3:]
    if geometry is None:
        raise ValueError(f"layout {layout} needs the head geometry to cut V out")
    h, k, d = geometry
    if layout == "phi3_qkv":
        want, lo, hi = (h + 2 * k) * d, (h + k) * d, (h + 2 * k) * d
    elif layout == "falcon_multi_query":
        want, lo, hi = (h + 2) * d, (h + 1) * d, (h + 2) * d
    elif layout in ("gpt_neox_qkv", "falcon_classic"):
        if f != 3 * h * d:
            raise ValueError(f"{layout} output of {f} features, expected {3 * h * d}")
        return x.view(-1, h, 3, d)[:, :, 2, :].reshape(-1, h * d)
    elif layout == "falcon_grouped":
        g = h // k + 2
        if h % k or f != k * g * d:
            raise ValueError(f"{layout} output of {f} features, expected {k * g * d}")
        return x.view(-1, k, g, d)[:, :, g - 1, :].reshape(-1, k * d)
    else:
        raise ValueError(f"unknown V layout {layout!r}")
    if f != want:
        raise ValueError(f"{layout} output of {f} features, expected {want}")
    return x[:, lo:hi]


def encode(layer, matrix):
    """rvd.v1.ActivationTensor of a 2-D torch tensor (copied to the host) or
    numpy array (float32, float16; float64 sent as float32)."""
    import numpy as np

    if isinstance(matrix, np.ndarray):
        a = matrix.astype(np.float32) if matrix.dtype == np.float64 else matrix
        dtypes = {np.dtype(np.float32): rvd_pb2.DTYPE_F32, np.dtype(np.float16): rvd_pb2.DTYPE_F16}
        if a.ndim != 2 or a.dtype.newbyteorder("=") not in dtypes:
            raise ValueError(f"layer {layer}: expected a 2-D float32/float16/float64 array, got "
                             f"{matrix.ndim}-D {matrix.dtype}")
        a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
        return rvd_pb2.ActivationTensor(layer=int(layer), dtype=dtypes[a.dtype.newbyteorder("=")],
                                        shape=list(a.shape), data=a.tobytes())
    import torch

    m = matrix.detach()
    if m.dtype == torch.float64:
        m = m.float()
    dtypes = {torch.float32: rvd_pb2.DTYPE_F32, torch.float16: rvd_pb2.DTYPE_F16,
              torch.bfloat16: rvd_pb2.DTYPE_BF16}
    if m.dtype not in dtypes:
        raise ValueError(f"layer {layer}: activations of dtype {m.dtype} (expected "
                         "float32, float16, bfloat16 or float64)")
    dtype = dtypes[m.dtype]
    m = m.contiguous().cpu()
    if m.dtype == torch.bfloat16:
        m = m.view(torch.int16)
    return rvd_pb2.ActivationTensor(layer=int(layer), dtype=dtype, shape=list(m.shape),
                                    data=m.numpy().tobytes())


def measure_activations(client, model_id, tensors, step=0, timeout=None):
    """Activation statistics of rvd.v1.ActivationTensors, in their order:
    as many MeasureActivations calls as CALL_MAX_BYTES needs (a single
    tensor over it is a ValueError). Returns the responses' stats."""
    batches, batch, size = [], [], 0
    for t in tensors:
        n = len(t.data)
        if n > CALL_MAX_BYTES:
            raise ValueError(f"layer {t.layer}: {n} bytes of activations exceed the "
                             f"{CALL_MAX_BYTES} one call may carry; use max_tokens=")
        if batch and size + n > CALL_MAX_BYTES:
            batches.append(batch)
            batch, size = [], 0
        batch.append(t)
        size += n
    if batch:
        batches.append(batch)
    stats = []
    for b in batches:
        r = client._unary("MeasureActivations", rvd_pb2.MeasureActivationsRequest(
            model_id=model_id, step=int(step), activations=b), timeout)
        stats.extend(r.stats)
    return stats


def activation_stats(client, model_id, matrices, step=0, timeout=None):
    """The statistics of {layer: 2-D matrix} (numpy arrays or torch tensors,
    tokens x features), without hooks: a list of ActivationStats in layer
    order. rvd.RvdError when rvd refuses or cannot be reached."""
    layers = sorted(matrices)
    tensors = [encode(l, matrices[l]) for l in layers]
    return _records(measure_activations(client, model_id, tensors, step, timeout), tensors)


def _records(stats, tensors):
    """ActivationStats of rvd's answers to `tensors` (the same order)."""
    return [ActivationStats(s.layer, s.effective_rank, s.frobenius_norm, s.max_singular_value,
                            s.entropy, s.participation_ratio, int(t.shape[0]), int(t.shape[1]))
            for s, t in zip(stats, tensors)]


class VActivationMonitor:
    """Seed 000's VActivationMonitor(model, layer_indices), backed by rvd.

    layer_indices: the layers to watch (None: every layer with a V
    projection). Also: address (rvd's HOST:PORT; default $RVD_ADDRESS,
    else 127.0.0.1:50051), arch (as RVMonitor's), model_id (rvd's name
    for the requests' log lines; default <arch>.act.<pid>.<n>), client (an
    rvd.Client to share), timeout (seconds per call), max_tokens (keep the
    first max_tokens rows of each matrix; None: all), on_error ("warn" |
    "raise"), transport ("auto" | "copy"; activations through CUDA IPC are
    not implemented)."""

    def __init__(self, model, layer_indices=None, address=None, arch=None, model_id=None,
                 client=None, timeout=30.0, max_tokens=None, on_error="warn",
                 transport="auto"):
        from . import architectures

        if on_error not in ("warn", "raise"):
            raise ValueError(f"on_error={on_error!r}: expected 'warn' or 'raise'")
        if transport not in ("auto", "copy"):
            raise ValueError(f"transport={transport!r}: activations go by copy "
                             "('auto' or 'copy'); IPC activations are not implemented")
        if max_tokens is not None and (isinstance(max_tokens, bool) or
                                       not isinstance(max_tokens, int) or max_tokens < 1):
            raise ValueError(f"max_tokens={max_tokens!r}: expected an integer >= 1")
        self.model = model
        self.on_error = on_error
        self.timeout = timeout
        self.max_tokens = max_tokens
        self.resolved = architectures.resolve(model, arch)
        self.arch = self.resolved.arch
        found = self.resolved.tensors
        if layer_indices is None:
            self._layers = sorted(found)
        else:
            self._layers = sorted({int(l) for l in layer_indices})
            missing = [l for l in self._layers if l not in found]
            if missing or not self._layers:
                raise ValueError(f"layers {missing or '[]'}: the model's V projections are "
                                 f"layers {min(found)}..{max(found)} ({self.resolved.pattern})")
        self.layout = self.resolved.layout
        self.geometry = self.resolved.geometry
        if self.layout not in ("separate", "gpt2_conv1d") and self.geometry is None:
            raise ValueError(f"{self.resolved.pattern}: a {self.layout} module needs the head "
                             f"geometry to cut V out: {self.resolved.geometry_source}")
        base = re.sub(r"[^A-Za-z0-9_.:-]", "_", self.arch or "model")[:80]
        self.model_id = model_id or f"{base}.act.{os.getpid()}.{next(_ids)}"
        self._owns_client = client is None
        self.client = client or Client(address, timeout=timeout)
        self.forward_passes = 0         # passes seen (model-level pre-hook)
        self.last_error: Optional[RvdError] = None
        self._pending = {}              # {layer: V activations} of the newest pass
        self._stats: Optional[List[ActivationStats]] = None  # its answer, once computed
        self._handles = [model.register_forward_pre_hook(self._new_pass)]
        for l in self._layers:
            module = model.get_submodule(found[l].module_path)
            self._handles.append(module.register_forward_hook(self._hook(l)))

    # ---- hooks ------------------------------------------------------------

    def _new_pass(self, module, args):
        self.forward_passes += 1
        self._pending = {}
        self._stats = None

    def _hook(self, layer):
        def hook(module, args, output):
            v = v_features(output, self.layout, self.geometry)
            if self.max_tokens is not None:
                v = v[: self.max_tokens]
            # A copy: the model may reuse or modify its output in place.
            self._pending[layer] = v.detach().clone()
            self._stats = None
        return hook

    # ---- seed 000's API ---------------------------------------------------

    @property
    def layer_indices(self) -> List[int]:
        return list(self._layers)

    @property
    def activation_stats(self) -> List[ActivationStats]:
        """The statistics of the newest forward pass, one record per watched
        layer that ran, in layer order ([] before the first pass, or when
        rvd failed and on_error="warn")."""
        if self._stats is None:
            return self.measure()
        return list(self._stats)

    def measure(self, step=None) -> List[ActivationStats]:
        """Sends the newest pass's activations to rvd now (step: the
        requests' step; default the number of forward passes)."""
        if not self._pending:
            return []
        layers = sorted(self._pending)
        tensors = [encode(l, self._pending[l]) for l in layers]
        try:
            stats = measure_activations(self.client, self.model_id, tensors,
                                        self.forward_passes if step is None else step,
                                        self.timeout)
        except RvdError as e:
            self.last_error = e
            if self.on_error == "raise":
                raise
            log.warning("rvd: activation statistics failed: %s", e)
            if e.unreachable:
                self.client.reconnect()
            return []
        self.last_error = None
        self._stats = _records(stats, tensors)
        return list(self._stats)

    def remove(self):
        """Removes the hooks (and closes the client it made)."""
        for h in self._handles:
            h.remove()
        self._handles = []
        if self._owns_client:
            self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()
