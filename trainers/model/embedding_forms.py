"""The form of plain linears of the q/k/v embeddings that do not compute with ``nn.Linear`` alone (each class's
``linear_form``, trainers.model.embeddings): the same outputs in floating point, in layers torchao can quantize
(trainers.model.quantize).

- SNE's second layers are one ``GroupedLinear`` (a batched matmul of the three (h, d_out) weights): three
  ``nn.Linear(h, d_out)``, one per q, k, v (``SNELinears``);
- F-SNE's first layer is sliced in its forward (tokens ``W[:, :d]``, codes ``W[:, d:]``): the token part becomes
  ``nn.Linear(d, h)`` and the code part, a constant once trained, the (parts, h) buffer ``codes_h``
  (``FSNELinears``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["FSNELinears", "SNELinears"]


class SNELinears(nn.Module):
    """SNE with its grouped second layer as one ``nn.Linear(h, d_out)`` per part: the same [q | k | v]."""

    def __init__(self, sne: nn.Module):   # trainers.model.embeddings.SNE
        super().__init__()
        self.parts, self.hidden, self.dim_out = sne.parts, sne.hidden, sne.dim_out
        self.fc1, self.act = sne.fc1, sne.act
        self.fc2 = nn.ModuleList()
        for p in range(sne.parts):
            layer = nn.Linear(sne.hidden, sne.dim_out, device=sne.fc2.weight.device, dtype=sne.fc2.weight.dtype)
            with torch.no_grad():
                layer.weight.copy_(sne.fc2.weight[p].T)  # GroupedLinear's (h, d_out) -> Linear's (d_out, h)
                layer.bias.copy_(sne.fc2.bias[p])
            self.fc2.append(layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]                                       # (B, N), or any leading dims
        hid = self.act(self.fc1(x)).view(*lead, self.parts, self.hidden)  # (B, N, 3, h)
        return torch.cat([fc(hid[..., p, :]) for p, fc in enumerate(self.fc2)], dim=-1)  # (B, N, [q | k | v])


class FSNELinears(nn.Module):
    """F-SNE with its first layer split: ``nn.Linear(d, h)`` on the tokens and the codes' projection
    ``C · Ws1[d:]`` (parts, h), fixed once trained, as a buffer; the second layer as it is."""

    def __init__(self, fsne: nn.Module, shared: dict | None = None):   # trainers.model.embeddings.FSNE
        """shared: the token parts made so far, by first layer (the maps of one site share F-SNE's layers, so
        their forms share one token part)."""
        super().__init__()
        self.parts, self.dim_out = fsne.parts, fsne.dim_out
        w = fsne.fc1.weight
        shared = {} if shared is None else shared
        if id(fsne.fc1) not in shared:
            fc1 = nn.Linear(fsne.dim, fsne.hidden, device=w.device, dtype=w.dtype)
            with torch.no_grad():
                fc1.weight.copy_(w[:, : fsne.dim])          # (h, d): the tokens' columns
                fc1.bias.copy_(fsne.fc1.bias)
            shared[id(fsne.fc1)] = fc1
        self.fc1 = shared[id(fsne.fc1)]
        codes = fsne.codes if fsne.rows is None else fsne.codes[list(fsne.rows)]   # the codes of its own parts
        with torch.no_grad():
            self.register_buffer("codes_h", F.linear(codes, w[:, fsne.dim:]).detach().clone())  # (3, h)
        self.act, self.fc2 = fsne.act, fsne.fc2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]                                       # (B, N), or any leading dims
        hid = self.act(self.fc1(x).unsqueeze(-2) + self.codes_h)  # (B, N, 3, h)
        return self.fc2(hid).reshape(*lead, self.parts * self.dim_out)  # (B, N, [q | k | v])
