"""``Shape``: what one choice is built and counted at, and ``Counted``, what every registered class answers.

Every class of a registry (trainers.model.choices) counts itself at a Shape, exactly, at batch 1:
``params(shape)`` (trainable parameters, as ``module.parameters()`` counts them) and ``macs(shape)``
(multiply-accumulates as ``FlopCounterMode`` counts them, halved; FFTs by trainers.model.attention.fft's
convention). ``check(shape, name)`` raises the ConfigError of a key the shape cannot serve. The contract tests
(tests/trainers/test_choices.py) build each class at several shapes and compare; the cost model
(trainers.model.cost) counts with these same methods.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    """One ViT-like stage: tokens of dim d in heads, a patch grid and the prefix tokens before it."""

    dim: int                          # token dim d
    heads: int = 1
    grid: tuple[int, int] = (1, 1)    # patch grid (H/p, W/p)
    prefix: int = 1                   # class (and register) tokens before the patches
    size: int = 0                     # the attention's size: performer features m, linformer k, nystrom landmarks
    rotary: bool = False              # positions rotate q and k (RoPE): rotated k and v may differ
    qkv_bias: bool = True
    proj_bias: bool = True
    in_chans: int = 3
    patch: int = 1
    stem_bias: bool = True            # the patch projection's bias (timm: False for pre-norm CLIP models)
    table_prefix: bool = True         # timm's learned table covers the prefix tokens (not no_embed_class)
    charts: int = 8                   # manifold key: charts H, their aggregation, context broadcasting
    aggregation: str = "vanilla"
    context: bool = False
    plain: bool = True                # timm's layers as the registered classes replace them exactly

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    @property
    def patches(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def tokens(self) -> int:
        return self.patches + self.prefix

    @property
    def img(self) -> int:
        return self.grid[0] * self.patch

    @classmethod
    def of_tokens(cls, dim: int, tokens: int, **kw) -> Shape:
        """A shape of ``tokens`` tokens and no patch grid (a q/k/v site, as its module sees it)."""
        return cls(dim, grid=(1, tokens), prefix=0, **kw)


class Counted:
    """What a registered class answers; the defaults: nothing to check, no parameters, no MACs."""

    @classmethod
    def check(cls, s: Shape, name: str) -> None:
        """Raise ConfigError naming the key when the shape cannot serve this choice (``name``: its
        registered name)."""

    @classmethod
    def params(cls, s: Shape) -> int:
        return 0

    @classmethod
    def macs(cls, s: Shape) -> int:
        return 0
