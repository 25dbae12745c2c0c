"""``linformer``: keys and values projected along the tokens to k (Wang et al. 2020), then softmax
attention over the k projected tokens: softmax(q (E k)ᵀ / √dh) (F v).

E and F (N x k each) are apart and shared by the heads; q, k and v come from the fused qkv, so the
q/k/v embeddings and the manifold key apply. (The Vision X-formers paper's Linformer, keys = values
from one head and E = F, is ``linformer_shared_kv``.) Needs a fixed token count N >= k.
Parameters: E and F, 2·N·k. MACs: E k and F v 2·N·k·d, then 2·N·k·d for the attention over k tokens.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from qkvsearch.trainers.model.attention.base import QKVAttention, check_size_within_tokens
from qkvsearch.trainers.model.attention.shape import Shape


class Linformer(QKVAttention):
    def init_mixer(self, device=None, dtype=None) -> None:
        self.proj_k = nn.Parameter(torch.empty(self.tokens, self.size, device=device, dtype=dtype))   # E: N -> k
        self.proj_v = nn.Parameter(torch.empty(self.tokens, self.size, device=device, dtype=dtype))   # F: N -> k
        for w in (self.proj_k, self.proj_v):
            nn.init.normal_(w, std=1 / math.sqrt(self.size))

    def mix(self, q, k, v, attn_mask=None, is_causal=False):
        k = torch.einsum("bhnd,nk->bhkd", k, self.proj_k)  # (B, heads, k, dh)
        v = torch.einsum("bhnd,nk->bhkd", v, self.proj_v)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop.p if self.training else 0.0)

    @classmethod
    def check(cls, s: Shape, name: str) -> None:
        check_size_within_tokens(s, name)

    @classmethod
    def mix_params(cls, s: Shape) -> int:
        return 2 * s.tokens * s.size

    @classmethod
    def mix_macs(cls, s: Shape) -> int:
        return 4 * s.tokens * s.size * s.dim
