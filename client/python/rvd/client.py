"""The plain client of rvd: numpy arrays in, measurements out; no torch.

    import numpy as np, rvd
    c = rvd.Client("127.0.0.1:50051")
    m = c.measure("my-model", [rvd.Tensor(layer=l, data=w) for l, w in vs.items()])
    m.rv, m.per_layer_pr
    c.latest("my-model"); c.history("my-model", limit=10); c.models()
    for event in c.watch("my-model"): ...   # Measurement or Gap; .cancel() stops

Every failed call raises rvd.RvdError with rvd's status code and message.
"""
import os
from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence

import grpc
import numpy as np

from ._stubs import rvd_pb2, rvd_pb2_grpc
from .errors import RvdError
from .types import AlertEvent, Gap, Measurement, ModelSummary

DEFAULT_ADDRESS = "127.0.0.1:50051"

# proto/rvd/v1/limits.h: every MeasureChunk but a tensor's last carries
# exactly kMaxChunkBytes; rvd receives messages of up to
# kMaxRequestMessageBytes and a client accepts replies of up to
# kMaxReplyMessageBytes.
MAX_CHUNK_BYTES = 4 << 20
MAX_REQUEST_MESSAGE_BYTES = 16 << 20
MAX_REPLY_MESSAGE_BYTES = 64 << 20
# Tensor bytes up to which one unary Measure is sent (room is left for the
# header); larger requests go by MeasureStream.
UNARY_MAX_BYTES = 8 << 20

DTYPES = {"f32": rvd_pb2.DTYPE_F32, "f16": rvd_pb2.DTYPE_F16,
          "bf16": rvd_pb2.DTYPE_BF16}
_DTYPE_SIZE = {"f32": 4, "f16": 2, "bf16": 2}
_NUMPY_DTYPES = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16"}


def layout_value(name):
    """rvd.v1.VLayout of a layout name of architectures.yaml ("separate")."""
    try:
        return rvd_pb2.VLayout.Value("V_LAYOUT_" + name.upper())
    except ValueError:
        known = [n[len("V_LAYOUT_"):].lower() for n in rvd_pb2.VLayout.keys()
                 if n != "V_LAYOUT_UNSPECIFIED"]
        raise ValueError(f"unknown V layout {name!r}; known: {', '.join(known)}")


@dataclass
class Tensor:
    """One layer's stored V tensor (as in the checkpoint: fused or not).

    data: a 2-D numpy array of float32 or float16, a uint16 array of
    bfloat16 bits with dtype="bf16", or bytes with shape and dtype.
    layout: a layout of architectures.yaml (rvd.v1.VLayout). num_heads,
    num_kv_heads, head_dim: the layer's geometry; for "separate" they may be
    left 0, meaning one head of all rows (per-layer PR needs no heads).
    """
    layer: int
    data: object
    layout: str = "separate"
    num_heads: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    name: str = ""
    dtype: str = ""
    shape: Sequence[int] = ()

    def encode(self):
        """(rvd.v1.TensorSpec, bytes-like of its data)."""
        data, dtype, shape = self.data, self.dtype, tuple(self.shape)
        if isinstance(data, np.ndarray):
            if not shape:
                shape = data.shape
            if not dtype:
                if data.dtype not in _NUMPY_DTYPES:
                    raise ValueError(
                        f"layer {self.layer}: numpy dtype {data.dtype} is not "
                        "float32 or float16 (bfloat16: uint16 bits with "
                        "dtype='bf16')")
                dtype = _NUMPY_DTYPES[data.dtype]
            data = np.ascontiguousarray(data)
            if data.dtype.byteorder == ">":
                data = data.astype(data.dtype.newbyteorder("<"))
            payload = memoryview(data).cast("B")
        else:
            payload = memoryview(data).cast("B")
        if dtype not in DTYPES:
            raise ValueError(f"layer {self.layer}: dtype {dtype!r} is not one of "
                             f"{', '.join(DTYPES)}")
        if len(shape) != 2:
            raise ValueError(f"layer {self.layer}: shape {shape} is not 2-D")
        rows, cols = int(shape[0]), int(shape[1])
        if payload.nbytes != rows * cols * _DTYPE_SIZE[dtype]:
            raise ValueError(f"layer {self.layer}: {payload.nbytes} bytes do not "
                             f"hold a {dtype} [{rows}, {cols}]")
        h, k, d = self.num_heads, self.num_kv_heads, self.head_dim
        if not (h and k and d):
            if self.layout != "separate" or h or k or d:
                raise ValueError(
                    f"layer {self.layer}: layout {self.layout} needs num_heads, "
                    "num_kv_heads and head_dim")
            h, k, d = 1, 1, rows
        spec = rvd_pb2.TensorSpec(
            name=self.name or f"layer{self.layer}", layer=self.layer,
            dtype=DTYPES[dtype], shape=[rows, cols],
            layout=layout_value(self.layout),
            geometry=rvd_pb2.HeadGeometry(num_heads=h, num_kv_heads=k,
                                          head_dim=d))
        return spec, payload


def _chunks(header, payloads):
    yield rvd_pb2.MeasureChunk(header=header)
    for i, p in enumerate(payloads):
        for offset in range(0, p.nbytes, MAX_CHUNK_BYTES):
            yield rvd_pb2.MeasureChunk(
                tensor_index=i, offset=offset,
                data=bytes(p[offset:offset + MAX_CHUNK_BYTES]))


class Watch:
    """An open WatchMeasurements stream: iterate for Measurement and Gap
    events (in rvd's sequence order); cancel() ends it."""

    def __init__(self, call):
        self._call = call
        self._cancelled = False

    def __iter__(self):
        try:
            for event in self._call:
                if event.HasField("gap"):
                    yield Gap.from_proto(event.gap)
                else:
                    yield Measurement.from_proto(event.measurement)
        except grpc.RpcError as e:
            if self._cancelled and e.code() == grpc.StatusCode.CANCELLED:
                return
            raise RvdError.from_rpc(e, "WatchMeasurements") from None

    def cancel(self):
        self._cancelled = True
        self._call.cancel()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.cancel()


class AlertWatch(Watch):
    """An open WatchAlerts stream: iterate for AlertEvent and Gap events (in
    rvd's alert sequence order), e.g. to checkpoint or lower the learning
    rate when an alert fires; cancel() ends it."""

    def __iter__(self):
        try:
            for event in self._call:
                if event.HasField("gap"):
                    yield Gap.from_proto(event.gap)
                else:
                    yield AlertEvent.from_proto(event.alert)
        except grpc.RpcError as e:
            if self._cancelled and e.code() == grpc.StatusCode.CANCELLED:
                return
            raise RvdError.from_rpc(e, "WatchAlerts") from None


def _read(path, what):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"{what} {path!r}: {e.strerror}") from None


def _channel_credentials(tls, tls_ca_file, tls_cert_file, tls_key_file,
                         auth_token, auth_token_file):
    """gRPC channel credentials for rvd's TLS settings, None for plaintext.
    The rules are rvctl's (client/cpp/channel.h): a CA file or tls=True
    (the system's roots) turns TLS on; a client certificate needs its key;
    a bearer token (auth_token, else the first line of auth_token_file,
    else $RVD_AUTH_TOKEN) needs TLS, since gRPC sends call credentials over
    secure channels only and rvd accepts a token on a TLS port only."""
    if (tls_cert_file is None) != (tls_key_file is None):
        raise ValueError("tls_cert_file and tls_key_file: both or neither")
    if auth_token is None and auth_token_file is not None:
        lines = _read(auth_token_file, "auth_token_file").decode().splitlines()
        auth_token = lines[0].strip() if lines else ""
        if not auth_token or any(c.isspace() for c in auth_token):
            raise ValueError(f"auth_token_file {auth_token_file!r}: expected "
                             "one token (no spaces) on its first line")
    if auth_token is None:
        auth_token = os.environ.get("RVD_AUTH_TOKEN") or None
    secure = tls or tls_ca_file is not None or tls_cert_file is not None
    if not secure:
        if auth_token is not None:
            raise ValueError("a bearer token needs TLS (tls_ca_file or "
                             "tls=True): rvd takes tokens over TLS only")
        return None
    creds = grpc.ssl_channel_credentials(
        root_certificates=None if tls_ca_file is None
        else _read(tls_ca_file, "tls_ca_file"),
        private_key=None if tls_key_file is None
        else _read(tls_key_file, "tls_key_file"),
        certificate_chain=None if tls_cert_file is None
        else _read(tls_cert_file, "tls_cert_file"))
    if auth_token is not None:
        creds = grpc.composite_channel_credentials(
            creds, grpc.access_token_call_credentials(auth_token))
    return creds


class Client:
    """A connection to rvd at `address` (HOST:PORT; default $RVD_ADDRESS, else
    127.0.0.1:50051). timeout: seconds each unary call may take (None: no
    deadline). Thread-safe as gRPC channels are.

    TLS, as rvctl takes it: tls_ca_file (the CA that signed rvd's
    certificate; tls=True trusts the system's roots instead),
    tls_cert_file + tls_key_file (a client certificate, for mutual TLS),
    tls_server_name (the name to check rvd's certificate against, when it
    differs from address's host), auth_token or auth_token_file (else
    $RVD_AUTH_TOKEN: sent as "authorization: Bearer ..." on every call;
    needs TLS)."""

    def __init__(self, address=None, timeout=60.0, *, tls=False,
                 tls_ca_file=None, tls_cert_file=None, tls_key_file=None,
                 tls_server_name=None, auth_token=None, auth_token_file=None):
        self.address = address or os.environ.get("RVD_ADDRESS", DEFAULT_ADDRESS)
        self.timeout = timeout
        self._credentials = _channel_credentials(
            tls, tls_ca_file, tls_cert_file, tls_key_file, auth_token,
            auth_token_file)
        self._server_name = tls_server_name
        self._channel = None
        self._stub = None
        self.reconnect()

    def reconnect(self):
        """Drops the channel and opens a new one, which connects at once
        (a channel that saw rvd go away waits out gRPC's reconnect backoff,
        up to the limit below, before it tries again)."""
        if self._channel is not None:
            self._channel.close()
        options = [
            ("grpc.max_send_message_length", MAX_REQUEST_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_REPLY_MESSAGE_BYTES),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 2000)]
        if self._credentials is None:
            self._channel = grpc.insecure_channel(self.address, options=options)
        else:
            if self._server_name is not None:
                options.append(("grpc.ssl_target_name_override", self._server_name))
            self._channel = grpc.secure_channel(self.address, self._credentials,
                                                options=options)
        self._stub = rvd_pb2_grpc.RvdStub(self._channel)

    def close(self):
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _unary(self, method, request, timeout=None):
        try:
            return getattr(self._stub, method)(
                request, timeout=self.timeout if timeout is None else timeout)
        except grpc.RpcError as e:
            raise RvdError.from_rpc(e, method) from None

    # ---- measuring --------------------------------------------------------

    @staticmethod
    def header(model_id, specs, step=0, early_layers=None, late_layers=None,
               per_head=False, variant=None):
        """The rvd.v1.MeasureHeader of a measurement (see rvd.proto)."""
        h = rvd_pb2.MeasureHeader(
            model_id=model_id, step=int(step), per_head=bool(per_head),
            early_layers=list(early_layers or ()),
            late_layers=list(late_layers or ()), tensors=specs)
        if variant:
            h.variant.name = variant
        return h

    def measure_encoded(self, header, payloads, timeout=None):
        """Measures header.tensors with their bytes; returns the proto
        rvd.v1.Measurement. One Measure call when small, else a stream."""
        total = sum(p.nbytes for p in payloads)
        if total <= UNARY_MAX_BYTES:
            return self._unary("Measure", rvd_pb2.MeasureRequest(
                header=header, data=[bytes(p) for p in payloads]), timeout)
        try:
            return self._stub.MeasureStream(
                _chunks(header, payloads),
                timeout=self.timeout if timeout is None else timeout)
        except grpc.RpcError as e:
            raise RvdError.from_rpc(e, "MeasureStream") from None

    def measure(self, model_id, tensors: Iterable[Tensor], step=0,
                early_layers=None, late_layers=None, per_head=False,
                variant=None, timeout=None) -> Measurement:
        """Measures one V tensor per layer. early_layers and late_layers: both
        or neither (rvd's default: the first and last quarter of the layers
        sent). variant: algebraic | naive | power_iter | sketch | fused
        (None: rvd's default)."""
        specs, payloads = [], []
        for t in tensors:
            spec, payload = t.encode()
            specs.append(spec)
            payloads.append(payload)
        header = self.header(model_id, specs, step, early_layers, late_layers,
                             per_head, variant)
        return Measurement.from_proto(
            self.measure_encoded(header, payloads, timeout))

    # ---- reading ----------------------------------------------------------

    def latest(self, model_id) -> Measurement:
        """The newest measurement of a model (RvdError NOT_FOUND if none)."""
        return Measurement.from_proto(self._unary(
            "GetLatest", rvd_pb2.GetLatestRequest(model_id=model_id)))

    def history(self, model_id, limit=0) -> List[Measurement]:
        """The measurements rvd keeps of a model, oldest first (the newest
        `limit`; 0: all)."""
        r = self._unary("GetHistory", rvd_pb2.GetHistoryRequest(
            model_id=model_id, limit=limit))
        return [Measurement.from_proto(m) for m in r.measurements]

    def models(self) -> List[ModelSummary]:
        """Every model rvd keeps measurements of, sorted by id."""
        r = self._unary("ListModels", rvd_pb2.ListModelsRequest())
        return [ModelSummary(s.model_id, s.measurements,
                             Measurement.from_proto(s.latest)
                             if s.HasField("latest") else None)
                for s in r.models]

    def watch(self, model_id="", after_sequence: Optional[int] = None) -> Watch:
        """A stream of the measurements of one model ("" : every model):
        first those kept with sequence > after_sequence (when given), then
        each new one; Gap events where rvd skipped some."""
        request = rvd_pb2.WatchRequest(model_id=model_id)
        if after_sequence is not None:
            request.after_sequence = after_sequence
        return Watch(self._stub.WatchMeasurements(request))

    def watch_alerts(self, model_id="",
                     after_sequence: Optional[int] = None) -> AlertWatch:
        """A stream of the alert events of one model ("": every model):
        first those kept with sequence > after_sequence (when given), then
        each new one (pending, firing, resolved, ...); Gap events where rvd
        skipped some."""
        request = rvd_pb2.WatchAlertsRequest(model_id=model_id)
        if after_sequence is not None:
            request.after_sequence = after_sequence
        return AlertWatch(self._stub.WatchAlerts(request))
