"""``softmax``: softmax(q kᵀ / √dh) v, timm's own ``Attention``.

With learned or no positions the model keeps timm's ``Attention`` as built (nothing is passed to timm);
``Softmax`` is built where positions rotate q and k, computing the same product with torch's SDPA.
MACs per head: 2·N²·dh (q kᵀ and the weighted sum of v).
"""
from __future__ import annotations

import torch.nn.functional as F

from qkvsearch.trainers.model.attention.base import QKVAttention
from qkvsearch.trainers.model.attention.shape import Shape


class Softmax(QKVAttention):
    def mix(self, q, k, v, attn_mask=None, is_causal=False):
        drop = self.attn_drop.p if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=drop, is_causal=is_causal)

    @classmethod
    def mix_macs(cls, s: Shape) -> int:
        return 2 * s.tokens * s.tokens * s.dim
