"""The models a ddp job trains (PyTorch's own modules, CPU), and their parameter counts.

* ``mlp``: ``IN_FEATURES -> hidden -> hidden -> OUT_FEATURES`` with ReLUs, on batches of
  ``BATCH`` vectors.
* ``transformer``: ``Linear(IN_FEATURES, hidden)``, one ``nn.TransformerEncoderLayer``
  (``hidden`` wide, ``HEADS`` heads, feed-forward ``2 * hidden``, no dropout), then
  ``Linear(hidden, OUT_FEATURES)`` per token, on ``BATCH`` sequences of ``SEQ`` tokens.
* ``moe``: a mixture-of-experts layer (Shazeer et al., "Outrageously Large Neural Networks",
  2017; GShard's expert capacity): ``Linear(IN_FEATURES, hidden)`` + ReLU and a gate
  ``Linear(hidden, world)``, one expert per rank (``hidden -> 2 hidden -> hidden`` with
  ReLU), then ``Linear(hidden, OUT_FEATURES)``. Each token goes to its top-1 expert with the
  gate's softmax weight; each expert takes ``BATCH // world`` tokens from every rank (more
  are dropped and pass through the residual only). Tokens move to their experts and back by
  ``all_to_all`` (gloo, with autograd: ``torch.distributed.nn.functional``), so its gradients
  do too. Every rank's expert is its own (not averaged by DDP); the rest is.

``params`` gives the elements of the gradient AllReduce of every step (DDP's parameters:
the expert's are left out) without importing torch.
"""
from __future__ import annotations

from contracts.enums import DdpModel

IN_FEATURES, OUT_FEATURES, BATCH = 64, 8, 32
SEQ, HEADS = 8, 4


def params(model: DdpModel, hidden: int, world: int) -> int:
    """Elements of DDP's gradient AllReduce per step (biases included; PyTorch's layouts:
    ``nn.Linear``, ``nn.MultiheadAttention``'s packed in-projection, two ``LayerNorm``)."""
    d = hidden
    ends = (IN_FEATURES * d + d) + (d * OUT_FEATURES + OUT_FEATURES)
    if model == "mlp":
        return ends + d * d + d
    if model == "transformer":
        # in-projection 3d*d + 3d, out-projection d*d + d, feed-forward d*2d + 2d and
        # 2d*d + d, two layer norms 2 * 2d
        return ends + 8 * d * d + 11 * d
    return ends + d * world + world  # the gate; the experts stay local


def build(model: DdpModel, hidden: int, world: int, rank: int, seed: int):
    """``(module, local, batch)``: the model (every parameter the same on every rank, but
    the names in ``local``, the rank's own expert, initialized from ``seed`` and ``rank``),
    the parameter names DDP must leave alone, and ``batch(generator) -> (x, y)`` with the
    model's shapes. Imports torch.

    Raises:
        ValueError: ``transformer`` with ``hidden`` not a multiple of ``HEADS``, ``moe``
            with fewer than 2 ranks or more ranks than ``BATCH``.
    """
    import torch
    from torch import nn

    def batch(*shape):
        return lambda gen: (torch.randn(*shape, IN_FEATURES, generator=gen),
                            torch.randn(*shape, OUT_FEATURES, generator=gen))

    torch.manual_seed(seed)
    d = hidden
    if model == "mlp":
        return nn.Sequential(nn.Linear(IN_FEATURES, d), nn.ReLU(), nn.Linear(d, d), nn.ReLU(),
                             nn.Linear(d, OUT_FEATURES)), [], batch(BATCH)
    if model == "transformer":
        if d % HEADS:
            raise ValueError(f"hidden: {d} is not a multiple of the transformer's {HEADS} heads")
        return nn.Sequential(nn.Linear(IN_FEATURES, d), nn.TransformerEncoderLayer(
            d, HEADS, dim_feedforward=2 * d, dropout=0.0, batch_first=True),
            nn.Linear(d, OUT_FEATURES)), [], batch(BATCH, SEQ)
    if not 2 <= world <= BATCH:
        raise ValueError(f"moe needs 2 to {BATCH} ranks (one expert each), not {world}")
    m = _moe_class()(d, world)
    torch.manual_seed(seed * 1000 + 1 + rank)
    for p in m.expert.parameters():
        nn.init.normal_(p, std=d ** -0.5)
    return m, [f"expert.{n}" for n, _ in m.expert.named_parameters()], batch(BATCH)


def _moe_class():
    import torch
    from torch import nn
    from torch.distributed.nn.functional import all_to_all_single

    class Moe(nn.Module):
        """Input layer and gate, this rank's expert, output layer; ``forward`` routes every
        token to its top-1 expert and back (see the module docstring)."""

        def __init__(self, hidden: int, world: int):
            super().__init__()
            self.inp = nn.Sequential(nn.Linear(IN_FEATURES, hidden), nn.ReLU())
            self.gate = nn.Linear(hidden, world)
            self.expert = nn.Sequential(nn.Linear(hidden, 2 * hidden), nn.ReLU(),
                                        nn.Linear(2 * hidden, hidden))
            self.out = nn.Linear(hidden, OUT_FEATURES)
            self.world = world

        def forward(self, x):
            h = self.inp(x)
            prob = self.gate(h).softmax(dim=1)
            cap = x.shape[0] // self.world
            top = prob.argmax(dim=1)
            picked = [torch.nonzero(top == e).flatten()[:cap] for e in range(self.world)]
            send = torch.cat([torch.cat([h[i], h.new_zeros(cap - len(i), h.shape[1])])
                              for i in picked])
            got = all_to_all_single(torch.empty_like(send), send)  # this rank's expert's
            back = all_to_all_single(torch.empty_like(send), self.expert(got))
            idx = torch.cat(picked)
            rows = torch.cat([back[e * cap:e * cap + len(i)] for e, i in enumerate(picked)])
            moe = h.new_zeros(h.shape).index_add(0, idx, rows * prob[idx, top[idx], None])
            return self.out(h + moe)

    return Moe
