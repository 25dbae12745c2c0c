"""``fnet``: FNet (Lee-Thorp et al. 2021) in place of the whole attention sub-layer: Re(FFT over tokens of
FFT over channels), no parameters and no q, k or v.

MACs: the FFT convention of trainers.model.attention.fft (2.5·L·log2 L a transform of length L, over every line).
"""
from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from qkvsearch.trainers.model.attention.fft import fft_macs
from qkvsearch.trainers.model.attention.shape import Counted, Shape


class FNet(nn.Module, Counted):
    fused_qkv: ClassVar[bool] = False

    def __init__(self, dim: int, *_args, **_timm_kwargs):
        super().__init__()
        self.dim = dim

    def qkv_projections(self) -> list[nn.Module]:
        """No q, k or v: it mixes tokens by Fourier transforms."""
        return []

    def forward(self, x: torch.Tensor, attn_mask=None, is_causal: bool = False) -> torch.Tensor:
        return torch.fft.fft2(x.float(), dim=(-2, -1)).real.type_as(x)

    @classmethod
    def layer(cls, s: Shape, rotation: type | None = None) -> type:
        return cls  # timm's attn_layer; nothing of the shape to fix (positions cannot rotate: spaces.choices)

    @classmethod
    def qkv_params(cls, s: Shape) -> int:
        return 0

    @classmethod
    def macs(cls, s: Shape) -> int:
        return fft_macs((1, s.tokens, s.dim), (1, 2))
