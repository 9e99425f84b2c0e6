"""Plain data classes for what rvd answers (no torch, no gRPC types)."""
from dataclasses import dataclass, field
from typing import Dict, List, Optional


def _timestamp(ts):
    return ts.seconds + ts.nanos * 1e-9


@dataclass
class Measurement:
    """One measurement as rvd stored it (rvd.v1.Measurement).

    rv is None when rvd left it absent (an early or late layer with PR 0).
    per_layer_pr maps layer -> PR; per_head_pr layer -> [PR of each kv head]
    (only when per_head was asked). timestamp: Unix seconds when rvd
    finished computing. elapsed_ms: rvd's engine time.
    """
    model_id: str
    step: int
    sequence: int
    rv: Optional[float]
    per_layer_pr: Dict[int, float]
    per_head_pr: Dict[int, List[float]]
    early_layers: List[int]
    late_layers: List[int]
    variant: str
    backend: str
    engine_version: str
    elapsed_ms: float
    receive_ms: float
    timestamp: float
    warnings: List[str]
    tensor_names: Dict[int, str] = field(default_factory=dict)
    notified: Optional[float] = None  # live models: rvd's receipt of the notification

    @classmethod
    def from_proto(cls, m):
        return cls(
            model_id=m.model_id, step=m.step, sequence=m.sequence,
            rv=m.rv if m.HasField("rv") else None,
            per_layer_pr={l.layer: l.pr for l in m.layers},
            per_head_pr={l.layer: list(l.head_pr) for l in m.layers if l.head_pr},
            early_layers=list(m.early_layers), late_layers=list(m.late_layers),
            variant=m.variant, backend=m.backend,
            engine_version=m.engine_version, elapsed_ms=m.elapsed_ms,
            receive_ms=m.receive_ms, timestamp=_timestamp(m.timestamp),
            warnings=list(m.warnings),
            tensor_names={l.layer: l.tensor_name for l in m.layers},
            notified=_timestamp(m.notified) if m.HasField("notified") else None)


@dataclass
class Gap:
    """Measurements a watch stream skipped: sequences [first, last]."""
    first_sequence: int
    last_sequence: int
    missed: int
    reason: str  # "slow_consumer" | "not_retained" | "unspecified"

    @classmethod
    def from_proto(cls, g):
        from ._stubs import rvd_pb2
        name = rvd_pb2.GapReason.Name(g.reason)
        return cls(g.first_sequence, g.last_sequence, g.missed,
                   name[len("GAP_REASON_"):].lower())


@dataclass
class AlertEvent:
    """One change of state of an alert rule for a model (rvd.v1.AlertEvent).

    state and previous_state: "inactive" | "pending" | "firing" |
    "resolved". since: Unix seconds the state began (the measurement's
    timestamp). value: R_V or the layer's PR; observed: what was compared
    with threshold (the value, the drop fraction, the change); baseline:
    the drop rule's baseline (else 0). measurement_sequence and step: the
    measurement that caused it (0 for an event of a reload).
    """
    sequence: int
    alert: str
    model_id: str
    state: str
    previous_state: str
    since: float
    value: float
    observed: float
    threshold: float
    baseline: float
    measurement_sequence: int
    step: int
    severity: str
    labels: Dict[str, str]
    annotations: Dict[str, str]
    description: str

    @classmethod
    def from_proto(cls, a):
        from ._stubs import rvd_pb2

        def state(s):
            return rvd_pb2.AlertState.Name(s)[len("ALERT_STATE_"):].lower()
        return cls(
            sequence=a.sequence, alert=a.alert, model_id=a.model_id,
            state=state(a.state), previous_state=state(a.previous_state),
            since=_timestamp(a.since), value=a.value, observed=a.observed,
            threshold=a.threshold, baseline=a.baseline,
            measurement_sequence=a.measurement_sequence, step=a.step,
            severity=a.severity, labels=dict(a.labels),
            annotations=dict(a.annotations), description=a.description)


@dataclass
class ModelSummary:
    model_id: str
    measurements: int  # measurements rvd keeps of this model
    latest: Optional[Measurement]


@dataclass
class RVMeasurement:
    """One entry of RVMonitor.history (seed 000's fields first).

    rv: R_V (None when rvd left it absent: an early or late layer had PR 0).
    per_layer_pr: {layer: PR}. timestamp: Unix seconds (rvd's, when it
    finished computing). step: the monitor's step in training mode (0 for the
    measurement at registration), None in inference mode. elapsed_ms: the
    monitor's wall time for the measurement (reading the weights, sending
    them, rvd computing; ipc transport: from the step notification to the
    result's arrival here). The rest: per_head_pr {layer: [PR per kv head]}
    when per_head; sequence: rvd's log position; trigger: why it was taken
    ("registration", "interval", "delta", "manual", "retry"; ipc also
    "first": rvd's first notified step); delta: the
    relative weight change ||W - W_last||_F / ||W_last||_F over the
    monitored V set when the delta trigger computed it, else None;
    engine_ms: rvd's engine time; latency_ms (ipc transport): from the step
    notification to rvd's timestamp of the result (both the host's wall
    clock), i.e. notification -> measurement recorded; rvd_ms: rvd's share
    of it, from its receipt of the notification.
    """
    rv: Optional[float]
    per_layer_pr: Dict[int, float]
    timestamp: float
    step: Optional[int]
    elapsed_ms: Optional[float]
    per_head_pr: Dict[int, List[float]] = field(default_factory=dict)
    sequence: int = 0
    trigger: str = ""
    delta: Optional[float] = None
    engine_ms: Optional[float] = None
    latency_ms: Optional[float] = None
    rvd_ms: Optional[float] = None
