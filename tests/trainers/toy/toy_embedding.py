"""A q/k/v embedding of the test's own, added as a user adds one: this class and its row in spaces.choices
(tests/trainers/test_toy_embedding.py). One hidden layer shared by q, k and v, one output layer each."""
from __future__ import annotations

import torch
from torch import nn

from qkvsearch.trainers.model.embeddings import SiteEmbedding, make_activation


class Toy(nn.Module, SiteEmbedding):
    """``σ(X W1) [Wq2 | Wk2 | Wv2]``: W1 (d, h) shared, the second layer one Linear(h, parts·d_out)."""

    def __init__(self, dim: int, hidden: int, dim_out: int, activation: str, parts: int):
        super().__init__()
        self.dim, self.hidden, self.dim_out, self.parts = dim, hidden, dim_out, parts
        self.fc1, self.act, self.fc2 = (nn.Linear(dim, hidden), make_activation(activation),
                                        nn.Linear(hidden, parts * dim_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))   # (B, N, d) -> (B, N, [q | k | v])

    @classmethod
    def build(cls, dim, hidden, dim_out=None, activation="relu", code_size=0, codes=None, parts=3):
        return cls(dim, hidden, dim if dim_out is None else dim_out, activation, parts)

    @classmethod
    def params(cls, dim, hidden, dim_out=None, code_size=0, parts=3) -> int:
        o = dim if dim_out is None else dim_out
        return dim * hidden + hidden + hidden * parts * o + parts * o

    @classmethod
    def macs(cls, dim, hidden, tokens, dim_out=None, code_size=0, parts=3) -> int:
        o = dim if dim_out is None else dim_out
        return tokens * (dim * hidden + hidden * parts * o)

    def linear_form(self, shared: dict | None = None) -> nn.Module:
        return self   # linears alone

    def tensor_parts(self, child: str, leaf: str, shape) -> dict[int, tuple[int, ...]]:
        return {0: (shape[0] // self.parts,) * self.parts} if child == "fc2" else {}   # rows [Wq2; Wk2; Wv2]
