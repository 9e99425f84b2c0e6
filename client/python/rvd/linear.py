"""MeasuredLinear and replace_v_proj_layers: seed 000's drop-in v_proj.

A MeasuredLinear is an nn.Linear (sharing the original's parameters) whose
forward also leaves the PR of its weight in `last_pr`. The PR is computed in
this process (compute_pr_algebraic, float64) once per weight version, not
at every forward: the weight's identity, storage and in-place version
counter say when it changed (see monitor.py). For R_V of a whole model, or
a fused QKV weight, use RVMonitor, which rvd measures.
"""
from torch import nn

from . import architectures
from .pr import compute_pr_algebraic


class MeasuredLinear(nn.Linear):
    """nn.Linear that records `last_pr` (None before its first forward)."""

    def __init__(self, in_features, out_features, bias=True, device=None,
                 dtype=None):
        super().__init__(in_features, out_features, bias, device=device,
                         dtype=dtype)
        self.last_pr = None
        self.pr_computations = 0  # how many times PR was computed
        self._pr_key = None

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "MeasuredLinear":
        """A MeasuredLinear over `linear`'s own weight and bias (no copy)."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"expected an nn.Linear, got {type(linear).__name__}")
        m = cls(linear.in_features, linear.out_features,
                bias=linear.bias is not None, device="meta")
        m.weight = linear.weight
        m.bias = linear.bias
        m.train(linear.training)
        return m

    def forward(self, x):
        w = self.weight
        key = self._pr_key  # a tuple: nn.Module registers no parameter in it
        if key is None or key[0] is not w or key[1] != w.data_ptr() \
                or key[2] != w._version:
            self.last_pr = compute_pr_algebraic(w)
            self.pr_computations += 1
            self._pr_key = (w, w.data_ptr(), w._version)
        return super().forward(x)


def replace_v_proj_layers(model, arch=None):
    """Replaces every layer's V projection (found as RVMonitor finds it) with
    a MeasuredLinear over the same parameters; returns {layer: module}.
    Only separate v_proj layers (nn.Linear): a fused QKV weight's PR is not
    V's, and rvd cuts V out of it (RVMonitor)."""
    resolved = architectures.resolve(model, arch)
    if resolved.layout != "separate":
        raise ValueError(f"{resolved.arch}: V sits in a fused {resolved.layout} "
                         "weight, not a separate v_proj; use RVMonitor")
    replaced = {}
    for layer, t in resolved.tensors.items():
        parent_path, _, attr = t.module_path.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        old = getattr(parent, attr)
        if isinstance(old, MeasuredLinear):
            replaced[layer] = old
            continue
        if not isinstance(old, nn.Linear):
            raise ValueError(f"{t.module_path} is a {type(old).__name__}, not an "
                             "nn.Linear")
        new = MeasuredLinear.from_linear(old)
        setattr(parent, attr, new)
        replaced[layer] = new
    return replaced


__all__ = ["MeasuredLinear", "replace_v_proj_layers", "compute_pr_algebraic"]

