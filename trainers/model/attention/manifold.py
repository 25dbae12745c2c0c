"""The two key choices (``key``): ``shared``, the key the q/k/v embedding makes with q and v (nothing of
its own), and ``manifold``: a key computed apart from query and value (Meng et al., "A Manifold Representation
of the Key in Vision Transformers", arXiv 2402.00534), following the paper's description (no public code).

Per block, tokens x (B, N, d) are expanded into H charts, each chart a trainable per-channel scale of
the tokens (s_h ⊙ x, s_h initialised to 1); each chart goes through a group-wise 1-D convolution pair
(kernel 1, groups = H: an MLP per chart, d -> r -> d with GELU), computed as one batched matmul per layer
(trainers.model.embeddings.GroupedLinear: the same maths and parameters as a grouped Conv1d of kernel 1, which
measured 4x slower on CPU); the H charts are fused into one key
(B, N, d) by an aggregation; optionally the token mean is added (context broadcasting).

Shapes the paper leaves open, chosen here:
- chart hidden width r = max(1, d // H), so the H chart MLPs together cost about two d x d linears
  (2·d² MACs a token, twice a linear key);
- aggregations: ``vanilla`` the mean of the charts; ``simple`` a softmax-weighted sum with one learned
  logit per chart (H parameters); ``spatial`` per-token chart weights, softmax of Linear(d, H)(x)
  (d·H + H parameters, N·d·H MACs); ``kua`` a Linear(H·d, d) over the concatenated charts
  (H·d² + d parameters, N·H·d² MACs);
- context broadcasting adds mean over tokens of the key to every token's key (no parameters).

Parameters: H·d (scales) + H·(d·r + r) + H·(r·d + d) (+ the aggregation's). MACs, batch 1: N·2·H·d·r
(+ the aggregation's); scales, means and weighted sums are element-wise and not counted
(trainers.model.cost's convention).

``KeyedQKV`` puts it in an attention's ``qkv`` slot: q and v come from the trial's embedding (``qv``,
(B, N, 2d): timm's nn.Linear or a 2-part SNE/P-SNE/F-SNE) and the output is ``[q | k | v]`` as
timm's attention (ViT) and XCA (XCiT) read it.
"""
from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from qkvsearch.spaces.keys import KEY_AGGREGATIONS
from qkvsearch.trainers.model.attention.shape import Counted, Shape
from qkvsearch.trainers.model.embeddings import GroupedLinear


def chart_width(dim: int, charts: int) -> int:
    return max(1, dim // charts)


class SharedKey(Counted):
    """The key comes from the q/k/v embedding with q and v: nothing of its own to build or count."""

    parts: ClassVar[int] = 3   # the embedding makes [q | k | v]

    @classmethod
    def build(cls, s: Shape) -> None:
        return None

    @classmethod
    def install(cls, model: nn.Module, arch) -> None:
        """Put this key into a built host's attentions (architecture.Arch ``arch``): nothing to put."""


class ManifoldKey(nn.Module, Counted):
    parts: ClassVar[int] = 2   # the embedding makes [q | v]; this module the key

    def __init__(self, dim: int, charts: int = 8, aggregation: str = "vanilla", context: bool = False):
        super().__init__()
        if aggregation not in KEY_AGGREGATIONS:
            raise ValueError(f"key_aggregation: expected one of {', '.join(KEY_AGGREGATIONS)}, given "
                             f"{aggregation!r}")
        r = chart_width(dim, charts)
        self.dim, self.charts, self.hidden, self.aggregation, self.context = dim, charts, r, aggregation, context
        self.scale = nn.Parameter(torch.ones(charts, dim))                      # (H, d)
        self.fc1 = GroupedLinear(charts, dim, r)        # per chart d -> r: weight (H, d, r)
        self.act = nn.GELU()
        self.fc2 = GroupedLinear(charts, r, dim)        # per chart r -> d: weight (H, r, d)
        if aggregation == "simple":
            self.logits = nn.Parameter(torch.zeros(charts))
        elif aggregation == "spatial":
            self.gate = nn.Linear(dim, charts)
        elif aggregation == "kua":
            self.fuse = nn.Linear(charts * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, d = x.shape
        H = self.charts
        charts = x.reshape(1, B * N, d) * self.scale[:, None, :]                     # (H, BN, d)
        y = self.fc2(self.act(self.fc1(charts))).view(H, B, N, d).permute(1, 2, 0, 3)  # (B, N, H, d)
        if self.aggregation == "vanilla":
            k = y.mean(2)
        elif self.aggregation == "simple":
            k = (y * self.logits.softmax(0)[:, None]).sum(2)
        elif self.aggregation == "spatial":
            k = (y * self.gate(x).softmax(-1).unsqueeze(-1)).sum(2)              # (B, N, H, 1) weights
        else:
            k = self.fuse(y.reshape(B, N, H * d))
        if self.context:
            k = k + k.mean(1, keepdim=True)
        return k

    def extra_repr(self) -> str:
        return f"dim={self.dim}, charts={self.charts}, hidden={self.hidden}, aggregation={self.aggregation}, " \
               f"context={self.context}"


    @classmethod
    def build(cls, s: Shape) -> ManifoldKey:
        return cls(s.dim, s.charts, s.aggregation, s.context)

    @classmethod
    def install(cls, model: nn.Module, arch) -> None:
        """Put a manifold key into every fused-qkv self-attention: qkv -> KeyedQKV(Linear(d, 2d), key)."""
        for _path, m in list(model.named_modules()):
            qkv = getattr(m, "qkv", None)
            if isinstance(qkv, nn.Linear) and qkv.out_features == 3 * qkv.in_features:
                d = qkv.in_features
                with torch.device(qkv.weight.device):
                    qv = nn.Linear(d, 2 * d, bias=qkv.bias is not None)
                    key = cls(d, arch.key_charts, arch.key_aggregation, arch.key_context)
                m.qkv = KeyedQKV(qv.to(qkv.weight.dtype), key.to(qkv.weight.dtype))

    @classmethod
    def params(cls, s: Shape) -> int:
        d, H, r = s.dim, s.charts, chart_width(s.dim, s.charts)
        extra = {"vanilla": 0, "simple": H, "spatial": d * H + H, "kua": H * d * d + d}[s.aggregation]
        return H * d + H * (d * r + r) + H * (r * d + d) + extra

    @classmethod
    def macs(cls, s: Shape) -> int:
        """Over ``s.tokens`` tokens (a site's token count)."""
        d, H, r = s.dim, s.charts, chart_width(s.dim, s.charts)
        extra = {"vanilla": 0, "simple": 0, "spatial": d * H, "kua": H * d * d}[s.aggregation]
        return s.tokens * (2 * H * d * r + extra)


class KeyedQKV(nn.Module):
    """``[q | k | v]`` (B, N, 3d) from a q/v embedding ``qv`` (B, N, 2d) and a separate key module."""

    def __init__(self, qv: nn.Module, key: nn.Module):
        super().__init__()
        self.qv, self.key = qv, key

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, v = self.qv(x).chunk(2, dim=-1)
        return torch.cat([q, self.key(x), v], dim=-1)
