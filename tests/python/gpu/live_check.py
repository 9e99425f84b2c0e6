"""Checking a live (ipc) RVMonitor on the GPU host, shared by the GPU tests
(tests/python/gpu/test_ipc_cuda.py) and bench/live_train.py.

The oracle: PR = (sum s_i^2)^2 / sum s_i^4 from the float64 Gram G = W W^T
of each V block (sum s_i^2 = tr G, sum s_i^4 = ||G||_F^2: the squared
singular values' sums, without an eigensolver), computed on the GPU from
copies of the V weights the trainer keeps at each notified step (clones
ordered on its stream after the update: exactly that step's weights); a
kv head's G is the diagonal block of its rows. LiveChecker also checks the
oracle itself once against torch.linalg.svdvals in float64 (pr64_svd) on
the first and last layer of the first measurement it sees.

The policy (rvd.proto TriggerPolicy, training mode): the first notified
step is measured; then a step is measured when it is measurement_interval
steps after the last measured one or, with adaptive, when
||W - W_last||_F / ||W_last||_F over the registered V set exceeds
delta_threshold (W_last: the weights at the last measured step).
"""
import math
import time

import torch


def rel(a, b):
    return abs(a - b) / abs(b) if b else abs(a - b)


def _gram(x):
    x = x.detach().to(torch.float64)
    return x @ x.T if x.shape[0] <= x.shape[1] else x.T @ x


def _pr_of_gram(g):
    return float(torch.trace(g) ** 2 / (g * g).sum())


def pr64(w):
    """PR of a 2-D weight from its float64 Gram."""
    return _pr_of_gram(_gram(w))


def pr64_svd(w):
    s = torch.linalg.svdvals(w.detach().to(torch.float64))
    s2 = s * s
    return float(s2.sum() ** 2 / (s2 * s2).sum())


def head_pr64(w, head_dim):
    """PR of each kv head (rows [h*d, (h+1)*d)) of a separate v_proj."""
    return layer_and_heads_pr64(w, head_dim)[1]


def layer_and_heads_pr64(w, head_dim):
    """(PR of w, [PR of each kv head]) from one float64 Gram when w is wide
    (its heads' Grams are G's diagonal blocks), else Gram by Gram."""
    heads = w.shape[0] // head_dim if head_dim else 0
    if w.shape[0] <= w.shape[1]:
        g = _gram(w)
        return _pr_of_gram(g), [
            _pr_of_gram(g[h * head_dim:(h + 1) * head_dim, h * head_dim:(h + 1) * head_dim])
            for h in range(heads)]
    return pr64(w), [pr64(w[h * head_dim:(h + 1) * head_dim]) for h in range(heads)]


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


class LiveChecker:
    """Keeps the V weights of notified steps and checks each measurement the
    monitor records against them.

    weights(): {layer: the live V tensor}; head_dim: per-head checks when
    not None; early, late: the R_V layer sets. keep(step) after the update
    and before the notification; check() takes every new history entry.
    Copies of steps no measurement can still come for are dropped."""

    def __init__(self, monitor, weights, head_dim=None, early=(), late=()):
        self.monitor = monitor
        self.weights = weights
        self.head_dim = head_dim
        self.early, self.late = list(early), list(late)
        self.kept = {}          # step -> {layer: clone}
        self.checked = 0        # history entries checked
        self.worst = 0.0        # largest relative error seen (PR, head PR, R_V)
        self.failures = []      # (step, what, got, want)
        self.steps = []         # steps of the entries checked, in order
        self.oracle_vs_svd = None  # the oracle against svdvals, once

    @torch.no_grad()
    def keep(self, step):
        self.kept[step] = {l: w.detach().clone() for l, w in self.weights().items()}

    def _cmp(self, step, what, got, want, tol):
        e = rel(got, want)
        self.worst = max(self.worst, e)
        if not e <= tol:
            self.failures.append((step, what, got, want))

    @torch.no_grad()
    def check(self, tol=1e-5):
        history = self.monitor.history
        for r in history[self.checked:]:
            self.checked += 1
            self.steps.append(r.step)
            kept = self.kept.get(r.step)
            if kept is None:
                self.failures.append((r.step, "no weights kept", None, None))
                continue
            both = {l: layer_and_heads_pr64(w, self.head_dim) for l, w in kept.items()}
            want = {l: v[0] for l, v in both.items()}
            if self.oracle_vs_svd is None:  # two layers: an SVD of 1024x4096 in
                # float64 takes the GPU about a second
                some = sorted(kept)[:1] + sorted(kept)[-1:]
                self.oracle_vs_svd = max(rel(want[l], pr64_svd(kept[l])) for l in some)
                if self.oracle_vs_svd > 1e-9:
                    self.failures.append((r.step, "oracle vs svdvals",
                                          self.oracle_vs_svd, 0.0))
            for l, w in kept.items():
                self._cmp(r.step, f"layer {l}", r.per_layer_pr.get(l, float("nan")),
                          want[l], tol)
                if self.head_dim:
                    heads = r.per_head_pr.get(l, [])
                    wh = both[l][1]
                    if len(heads) != len(wh):
                        self.failures.append((r.step, f"layer {l} heads", heads, wh))
                    for h, (a, b) in enumerate(zip(heads, wh)):
                        self._cmp(r.step, f"layer {l} head {h}", a, b, tol)
            if self.early and self.late and r.rv is not None:
                rv = geomean([want[l] for l in self.late]) / \
                    geomean([want[l] for l in self.early])
                self._cmp(r.step, "R_V", r.rv, rv, tol)
        if self.steps:
            newest = self.steps[-1]
            for s in [s for s in self.kept if s < newest]:
                del self.kept[s]  # a later measurement came: none can for these

    def wait_for_step(self, step, timeout):
        """Polls the history until an entry at `step` (or later) arrived;
        True if one did."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            h = self.monitor.history
            if h and h[-1].step is not None and h[-1].step >= step:
                return True
            time.sleep(0.0005)
        return False


class PolicyOracle:
    """rvd's training-mode policy, followed step by step from the weights
    (float64 on the GPU). decide(step, weights) -> (expected, delta,
    borderline) before rvd's decision is known; then measured(step,
    weights) when rvd did measure it (W_last follows rvd, so that one
    borderline call does not shift every later one). A delta within
    `margin` (relative) of the threshold is borderline: rvd's own float
    arithmetic may fall on either side."""

    def __init__(self, interval, adaptive, threshold, margin=1e-4):
        self.interval, self.adaptive, self.threshold = interval, adaptive, threshold
        self.margin = margin
        self.last_step = None
        self.last = None      # {layer: clone} at the last measured step
        self.last_sq = None

    @torch.no_grad()
    def decide(self, step, weights):
        if self.last_step is None:
            return True, None, False
        if step - self.last_step >= self.interval:
            return True, None, False
        if not self.adaptive:
            return False, None, False
        num = sum(float(torch.sum((w.double() - self.last[l].double()) ** 2))
                  for l, w in weights.items())
        delta = math.sqrt(num / self.last_sq) if self.last_sq else math.inf
        border = abs(delta - self.threshold) <= self.margin * self.threshold
        return delta > self.threshold, delta, border

    @torch.no_grad()
    def measured(self, step, weights):
        self.last_step = step
        self.last = {l: w.detach().clone() for l, w in weights.items()}
        self.last_sq = sum(float(torch.sum(w.double() ** 2)) for w in self.last.values())
