"""The trigger policy as the tests expect it, computed from the weights the
test keeps (float64), and a controlled weight update."""
import numpy as np
import torch


def perturb_(model, layers, direction, size):
    """Adds size * ||W|| * direction (unit Frobenius) to each layer's V, in
    place (an optimizer-like update that bumps the version counter)."""
    with torch.no_grad():
        for l in layers:
            w = model.model.layers[l].self_attn.v_proj.weight
            w.add_(direction[l] * (size * float(w.norm())))


def simulate(updates, interval, threshold, layers):
    """The expected (step, trigger, delta) of the policy, in float64, from the
    weights the test itself keeps."""
    expected, last = [(0, "registration", None)], {l: w.copy() for l, w in updates[0].items()}
    for n in range(1, len(updates)):
        now = updates[n]
        if all(np.array_equal(now[l], last[l]) for l in layers):
            continue
        if n % interval == 0:
            expected.append((n, "interval", None))
            last = {l: w.copy() for l, w in now.items()}
            continue
        num = sum(np.sum((now[l] - last[l]) ** 2) for l in layers)
        den = sum(np.sum(last[l] ** 2) for l in layers)
        delta = float(np.sqrt(num / den))
        if delta > threshold:
            expected.append((n, "delta", delta))
            last = {l: w.copy() for l, w in now.items()}
    return expected
