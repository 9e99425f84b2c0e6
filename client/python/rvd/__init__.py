"""rvd: the Python client of the rvd daemon (R_V and PR of transformer V
projections). See client/python/README.md.

Without torch: Client (measure, history, latest, models, watch,
watch_alerts), Tensor, AlertWatch, AlertEvent,
Measurement, Gap, ModelSummary, RvdError, TransportUnavailable,
compute_pr_algebraic.
With torch (imported on first use): RVMonitor, RVMeasurement,
MeasuredLinear, replace_v_proj_layers, MODEL_V_PROJ_PATHS (the
architecture registry, from config/architectures.yaml), and
VActivationMonitor with ActivationStats (V activation statistics).
"""
from .client import AlertWatch, Client, Tensor, Watch
from .errors import RvdError, TransportUnavailable
from .pr import compute_pr_algebraic
from .types import AlertEvent, Gap, Measurement, ModelSummary, RVMeasurement

__version__ = "0.1.0"

_LAZY = {
    "RVMonitor": "monitor",
    "MeasuredLinear": "linear",
    "replace_v_proj_layers": "linear",
    "MODEL_V_PROJ_PATHS": "architectures",
    "VActivationMonitor": "activations",
    "ActivationStats": "activations",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        module = importlib.import_module(f".{_LAZY[name]}", __name__)
        value = getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rvd' has no attribute {name!r}")


__all__ = ["Client", "Tensor", "Watch", "AlertWatch", "AlertEvent",
           "RvdError", "TransportUnavailable", "compute_pr_algebraic",
           "Gap", "Measurement", "ModelSummary", "RVMeasurement",
           *_LAZY]
