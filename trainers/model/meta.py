"""Building a model on the meta device without running its initialisation.

On the meta device a tensor has a shape and no data, yet torch still runs each initialiser: ``normal_`` and
``uniform_`` go through Python decompositions that cost up to tens of milliseconds a call, so timm's
``init_weights`` makes building a ViT-B on the meta device take seconds (measured 5 s with torch 2.14, 0.5 s
with this mode). ``skip_meta_init`` makes the in-place initialisers no-ops on meta tensors: there is nothing
to fill. Everything else (shapes, every module, every check a constructor makes) runs as it does.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["on_meta", "skip_meta_init"]

# the in-place ops initialisers fill a tensor with (torch.nn.init, timm.layers.weight_init)
_FILLS = frozenset({"uniform_", "normal_", "zero_", "fill_", "erfinv_", "clamp_", "mul_", "add_", "sub_", "div_",
                    "copy_", "exponential_", "random_", "bernoulli_", "log_normal_", "cauchy_", "geometric_",
                    "sqrt_", "abs_", "fmod_", "masked_fill_", "index_fill_"})


class _SkipMetaInit(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in _FILLS and args and isinstance(args[0], torch.Tensor) and args[0].is_meta:
            return args[0]
        return func(*args, **(kwargs or {}))


def on_meta() -> bool:
    """Whether new tensors go to the meta device (``with torch.device("meta")``)."""
    return torch.get_default_device().type == "meta"


@contextlib.contextmanager
def skip_meta_init() -> Iterator[None]:
    """Within it, in-place fills of meta tensors return at once (elsewhere nothing changes)."""
    with _SkipMetaInit():
        yield
