"""Network-wide correction of pairwise clock estimates (the Huygens "network effect").

Pairwise estimates around any loop of the probe graph should sum to zero; their surplus is
estimation error. A weighted least-squares fit of one offset (and, separately, one drift) per
node to all edges at once spreads every loop's surplus over its edges and averages the errors of
many paths, so each node is more accurate than any single pair.

Source: Y. Geng et al., "Exploiting a Natural Network Effect for Scalable, Fine-grained Clock
Synchronization", NSDI 2018 (the network effect): minimise sum over edges (d_ij - (theta_j -
theta_i))^2, a Laplacian solve, per window.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
from scipy.linalg import cho_factor, cho_solve

__all__ = ["GraphSolve", "NodeEstimate", "solve"]


@dataclass
class NodeEstimate:
    """One node's clock relative to the reference: ``clock_node - clock_ref = offset_ns +
    drift_ppm * 1e-6 * (t - t_ref)`` at the edges' common reference instant.

    Attributes:
        offset_ns: ns; 0 for the reference.
        drift_ppm: ppm; 0 for the reference.
        offset_sigma_ns: one-sigma uncertainty, ns (0 for the reference; NaN when the graph has
            no loop, i.e. the residuals say nothing about the edges' errors).
        drift_sigma_ppm: one-sigma uncertainty, ppm (same rules).
    """

    offset_ns: float
    drift_ppm: float
    offset_sigma_ns: float
    drift_sigma_ppm: float


def _reachable(n: int, ref: int, pairs: list[tuple[int, int]]) -> set[int]:
    adj: list[list[int]] = [[] for _ in range(n)]
    for a, b in pairs:
        adj[a].append(b)
        adj[b].append(a)
    seen, todo = {ref}, deque([ref])
    while todo:
        u = todo.popleft()
        for v in adj[u]:
            if v not in seen:
                seen.add(v)
                todo.append(v)
    return seen


def solve(nodes: list[str], edges: list[tuple[str, str, float, float, float]],
          reference: str) -> dict[str, NodeEstimate]:
    """Weighted least squares over the probe graph for every node's offset and drift.

    Minimises ``sum_e w_e * (o_e - (theta_b - theta_a))**2`` with ``theta_reference = 0``
    (normal equations: the weighted graph Laplacian with the reference's row and column
    removed), and the same for drifts with the same weights. A loop's surplus is spread over
    its edges in inverse proportion to their weights (equally for equal weights).

    Uncertainties: the covariance is ``s2 * inv(L_red)`` with ``s2 = sum_e w_e r_e**2 / dof``
    from the residuals ``r_e`` (the a-posteriori variance factor), ``dof = n_edges - (n_nodes
    - 1)``. Weights therefore only need to be relative (e.g. ``1 / residual_ns**2`` of the pair
    fits) and the same weights serve offsets and drifts. With no loop (``dof == 0``) the
    sigmas are NaN.

    All edges must refer to the same instant (evaluate each pair fit there, e.g. with
    ``PairFit.offset_at``); "the same instant" read on different clocks differs by their
    offsets (ms), which moves an offset by drift * offset, ~1 ns at 100 ppm and 10 ms.
    Drifts of edges are relative to the edge's first node's clock; summing them around a loop
    is consistent to ~1e-4 relative, far below the estimation noise.

    Args:
        nodes: node names, unique; must contain ``reference``.
        edges: ``(a, b, offset_ns, drift_ppm, weight)``: the estimate of ``b - a`` (ns, ppm)
            and its weight (> 0, finite). Parallel and opposite edges are fine.
        reference: the node whose clock is the zero.

    Returns:
        ``{node: NodeEstimate}`` for every node of ``nodes``.

    Raises:
        ValueError: duplicate node names, ``reference`` not in ``nodes``, an edge naming an
            unknown node, a self-loop, a non-finite value or a weight <= 0, or nodes that no
            edge path connects to the reference (the message names them).
    """
    if len(set(nodes)) != len(nodes):
        dup = sorted({v for v in nodes if nodes.count(v) > 1})
        raise ValueError(f"duplicate node names: {dup}")
    if reference not in nodes:
        raise ValueError(f"reference {reference!r} is not among the nodes")
    idx = {v: i for i, v in enumerate(nodes)}
    n, ref = len(nodes), idx[reference]
    ia, ib, off, dr, w = [], [], [], [], []
    for k, e in enumerate(edges):
        if len(e) != 5:
            raise ValueError(f"edge {k} must be (a, b, offset_ns, drift_ppm, weight), got {e!r}")
        a, b, o, d, wt = e
        for v in (a, b):
            if v not in idx:
                raise ValueError(f"edge {k} ({a!r} -> {b!r}) names unknown node {v!r}")
        if a == b:
            raise ValueError(f"edge {k} is a self-loop on {a!r}")
        if not (np.isfinite(o) and np.isfinite(d) and np.isfinite(wt)) or wt <= 0:
            raise ValueError(f"edge {k} ({a!r} -> {b!r}) needs finite offset/drift and a "
                             f"weight > 0, got offset={o}, drift={d}, weight={wt}")
        ia.append(idx[a])
        ib.append(idx[b])
        off.append(float(o))
        dr.append(float(d))
        w.append(float(wt))
    seen = _reachable(n, ref, list(zip(ia, ib, strict=True)))
    if len(seen) < n:
        lost = sorted(v for v in nodes if idx[v] not in seen)
        raise ValueError(f"no edge path from reference {reference!r} to: {', '.join(lost)}")
    out = {reference: NodeEstimate(0.0, 0.0, 0.0, 0.0)}
    if n == 1:
        return out
    x, sig = GraphSolve(n, ref, np.array(ia), np.array(ib), np.asarray(w)).solve(
        np.column_stack([off, dr]))
    for i in range(n):
        if i != ref:
            out[nodes[i]] = NodeEstimate(float(x[i, 0]), float(x[i, 1]),
                                         float(sig[i, 0]), float(sig[i, 1]))
    return {v: out[v] for v in nodes}


class GraphSolve:
    """``solve``'s least squares on one graph with one set of weights, factorised once and
    solved for any number of edge values (the coordinator solves a window twice, and its
    baseline, on the same weights).

    The normal equations' matrix is the weighted graph Laplacian less the reference's row
    and column, (n - 1) x (n - 1): assembled from the edge list in O(edges) and factorised by
    Cholesky (dense: at a few hundred nodes that is ~1 ms, and the uncertainties need the
    diagonal of its inverse anyway). No input checks: ``solve`` makes them.

    Args:
        n: nodes (indices 0..n-1), n >= 2; every one connected to ``ref`` by edges.
        ref: the reference node's index.
        ia, ib: shape (m,) int, each edge's nodes (b - a is its value).
        w: shape (m,) float > 0, the edges' weights.
    """

    def __init__(self, n: int, ref: int, ia: np.ndarray, ib: np.ndarray, w: np.ndarray):
        self.n, self.ref = n, ref
        keep = np.arange(n) != ref
        self.keep, self.ia, self.ib = keep, ia, ib
        self.w = w / w.max()  # scale-free; keeps the Laplacian well-scaled
        lap = np.zeros((n, n))
        np.add.at(lap, (ia, ib), -self.w)
        np.add.at(lap, (ib, ia), -self.w)
        lap[np.diag_indices(n)] = np.bincount(ia, self.w, n) + np.bincount(ib, self.w, n)
        self.cho = cho_factor(lap[np.ix_(keep, keep)])
        self.cov_diag = np.diag(cho_solve(self.cho, np.eye(n - 1)))

    def solve(self, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Node values and their one-sigma uncertainties for edge values ``y``, shape (m, c)
        (e.g. offsets ns and drifts ppm): arrays (n, c), the reference's row 0 (sigmas NaN
        without a loop, as ``solve`` says)."""
        wy = self.w[:, None] * y
        rhs = np.zeros((self.n, y.shape[1]))      # incidence^T (w y): +b, -a
        np.add.at(rhs, self.ib, wy)
        np.subtract.at(rhs, self.ia, wy)
        x = np.zeros((self.n, y.shape[1]))
        x[self.keep] = cho_solve(self.cho, rhs[self.keep])
        resid = y - (x[self.ib] - x[self.ia])
        dof = len(self.ia) - (self.n - 1)
        sig = np.zeros_like(x)
        if dof > 0:
            s2 = (self.w[:, None] * resid ** 2).sum(axis=0) / dof
            sig[self.keep] = np.sqrt(np.outer(self.cov_diag, s2))
        else:
            sig[self.keep] = np.nan
        return x, sig
