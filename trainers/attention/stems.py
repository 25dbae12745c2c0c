"""Patch embeddings for timm's ViT ``embed_layer``: timm's own ``PatchEmbed`` (``linear``: one p x p
stride-p convolution) or ``ConvStem`` (``conv``), the Vision X-formers paper's convolutional stem.

ConvStem: conv3x3(in -> 32) BN ReLU, conv3x3(32 -> 64) BN ReLU, then the projection to d: conv3x3
stride 1 at patch 1 (the paper's third 3x3 conv, 64 -> 128 = d there), a p x p stride-p conv otherwise
(patchifying as timm's PatchEmbed does). The 3x3 convolutions have no bias (BatchNorm follows); the
projection has one. It subclasses timm's PatchEmbed so grid size, token count and flattening stay timm's.
Parameters: 9·in·32 + 2·32 + 9·32·64 + 2·64 + k²·64·d + d (k = 3 at patch 1, else p).
MACs, batch 1, image S x S: S²·9·(in·32 + 32·64) + (S/p)²·k²·64·d.
"""
from __future__ import annotations

from timm.layers import PatchEmbed
from torch import nn

STEM_CHANNELS = (32, 64)


def stem_kernel(patch: int) -> int:
    return 3 if patch == 1 else patch


class ConvStem(PatchEmbed):
    def __init__(self, img_size=224, patch_size=16, in_chans=3, embed_dim=768, bias=True, device=None, dtype=None,
                 **kwargs):
        super().__init__(img_size=img_size, patch_size=patch_size, in_chans=in_chans, embed_dim=embed_dim,
                         bias=bias, device=device, dtype=dtype, **kwargs)
        dd = {"device": device, "dtype": dtype}
        p = self.patch_size[0]
        k = stem_kernel(p)
        layers, c = [], in_chans
        for out in STEM_CHANNELS:
            layers += [nn.Conv2d(c, out, 3, padding=1, bias=False, **dd), nn.BatchNorm2d(out, **dd), nn.ReLU()]
            c = out
        layers.append(nn.Conv2d(c, embed_dim, k, stride=p, padding=1 if p == 1 else 0, bias=bias, **dd))
        self.proj = nn.Sequential(*layers)


def stem_params(in_chans: int, dim: int, patch: int, bias: bool = True) -> int:
    a, b = STEM_CHANNELS
    k = stem_kernel(patch)
    return 9 * in_chans * a + 2 * a + 9 * a * b + 2 * b + k * k * b * dim + (dim if bias else 0)


def stem_macs(in_chans: int, dim: int, patch: int, img: int) -> int:
    a, b = STEM_CHANNELS
    k = stem_kernel(patch)
    return img * img * 9 * (in_chans * a + a * b) + (img // patch) ** 2 * k * k * b * dim


def linear_patch_params(in_chans: int, dim: int, patch: int, bias: bool = True) -> int:
    return patch * patch * in_chans * dim + (dim if bias else 0)


def linear_patch_macs(in_chans: int, dim: int, patch: int, img: int) -> int:
    return (img // patch) ** 2 * patch * patch * in_chans * dim
