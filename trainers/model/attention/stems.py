"""Patch embeddings (``patch_embed``) for timm's ViT ``embed_layer`` and the MLP-Mixer's stem; each
subclasses timm's ``PatchEmbed``, so grid size, token count and flattening stay timm's.

- ``linear``: timm's PatchEmbed, one p x p stride-p convolution (ViT's).
  Parameters p²·in·d + d; MACs (S/p)²·p²·in·d (image S x S, batch 1).
- ``conv``: conv3x3(in -> 32) BN ReLU, conv3x3(32 -> 64) BN ReLU, then the projection to d: a 3x3
  conv at patch 1, a p x p stride-p conv otherwise. The 3x3 convolutions have no bias (BatchNorm
  follows); the projection has one. Written here, with the BN-ReLU that convolutional stems usually
  have (e.g. Xiao et al. 2021, "Early convolutions help transformers see better"); it is not the
  Vision X-formers paper's stem (that is ``conv_plain``).
- ``conv_plain``: the Vision X-formers paper's stem (Jeevan & Sethi 2021, its hybrid models): three
  biased 3x3 convolutions in -> 32 -> 64 -> d with nothing between them, all stride 1 at patch 1;
  at patch p > 1 the last is a p x p stride-p conv, as for ``conv``.
Parameters (conv_plain): 9·in·32 + 32 + 9·32·64 + 64 + k²·64·d + d (k = 3 at patch 1, else p); (conv):
the same with the two BatchNorms' 2·32 + 2·64 instead of the two biases.
MACs (both): S²·9·(in·32 + 32·64) + (S/p)²·k²·64·d.
"""
from __future__ import annotations

from typing import ClassVar

from timm.layers import PatchEmbed
from torch import nn

from qkvsearch.trainers.model.attention.shape import Counted, Shape

STEM_CHANNELS = (32, 64)


def stem_kernel(patch: int) -> int:
    return 3 if patch == 1 else patch


class LinearStem(PatchEmbed, Counted):
    """timm's PatchEmbed itself (a model with ``linear`` keeps timm's own)."""

    @classmethod
    def params(cls, s: Shape) -> int:
        return s.patch * s.patch * s.in_chans * s.dim + (s.dim if s.stem_bias else 0)

    @classmethod
    def macs(cls, s: Shape) -> int:
        return s.patches * s.patch * s.patch * s.in_chans * s.dim


class _ThreeConvStem(PatchEmbed, Counted):
    """Two 3x3 convolutions to STEM_CHANNELS, then the projection to d; ``batch_norm``: BN-ReLU after each 3x3."""

    batch_norm: ClassVar[bool]

    def __init__(self, img_size=224, patch_size=16, in_chans=3, embed_dim=768, bias=True, device=None, dtype=None,
                 **kwargs):
        super().__init__(img_size=img_size, patch_size=patch_size, in_chans=in_chans, embed_dim=embed_dim,
                         bias=bias, device=device, dtype=dtype, **kwargs)
        dd = {"device": device, "dtype": dtype}
        p = self.patch_size[0]
        layers, c = [], in_chans
        for out in STEM_CHANNELS:
            layers.append(nn.Conv2d(c, out, 3, padding=1, bias=not self.batch_norm, **dd))
            if self.batch_norm:
                layers += [nn.BatchNorm2d(out, **dd), nn.ReLU()]
            c = out
        layers.append(nn.Conv2d(c, embed_dim, stem_kernel(p), stride=p, padding=1 if p == 1 else 0, bias=bias, **dd))
        self.proj = nn.Sequential(*layers)

    @classmethod
    def params(cls, s: Shape) -> int:
        a, b = STEM_CHANNELS
        k = stem_kernel(s.patch)
        return 9 * s.in_chans * a + a + 9 * a * b + b + k * k * b * s.dim + (s.dim if s.stem_bias else 0) \
            + (a + b if cls.batch_norm else 0)   # BatchNorm: weight and bias (2a + 2b) in place of the biases (a + b)

    @classmethod
    def macs(cls, s: Shape) -> int:
        a, b = STEM_CHANNELS
        k = stem_kernel(s.patch)
        return s.img * s.img * 9 * (s.in_chans * a + a * b) + s.patches * k * k * b * s.dim


class ConvStem(_ThreeConvStem):
    batch_norm = True


class PlainConvStem(_ThreeConvStem):
    batch_norm = False
