"""compute_pr_algebraic: PR of one matrix in this process, no daemon.

PR(W) = (sum s_i^2)^2 / sum s_i^4 = ||W||_F^4 / ||G||_F^2 with G the Gram
matrix of W's smaller side (W W^T or W^T W: both have the eigenvalues s_i^2).
"""
import numpy as np


def compute_pr_algebraic(W) -> float:
    """The participation ratio of a 2-D matrix (a torch tensor or anything
    numpy takes), 1 <= PR <= rank; 0.0 for an all-zero matrix (no spectrum,
    as rvd reports it).

    Computed in float64 (seed 000 promotes to at least float32; float64 keeps
    the result within rounding of an SVD's for any shape a V block has).
    """
    if hasattr(W, "detach"):  # a torch tensor, on any device
        import torch
        w = W.detach()
        if w.dim() != 2:
            raise ValueError(f"expected a 2-D matrix, got shape {tuple(w.shape)}")
        w = w.to(torch.float64)
        g = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
        fro2 = float(torch.sum(w * w))
        gram2 = float(torch.sum(g * g))
    else:
        w = np.asarray(W, dtype=np.float64)
        if w.ndim != 2:
            raise ValueError(f"expected a 2-D matrix, got shape {w.shape}")
        g = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
        fro2 = float(np.sum(w * w))
        gram2 = float(np.sum(g * g))
    if gram2 == 0.0:
        return 0.0
    return fro2 * fro2 / gram2
