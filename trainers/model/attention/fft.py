"""A FLOP formula for FFTs (and torch's CPU SDPA kernel), which ``torch.utils.flop_counter.FlopCounterMode``
otherwise counts as zero.

Convention: a 1-D complex transform of length L costs 5·L·log2(L) real floating-point operations (the
radix-2 Cooley-Tukey count), i.e. 2.5·L·log2(L) multiply-accumulates; a real-input (r2c) or
real-output (c2r) transform is counted like a complex one of the same length; a transform over several
dims is one 1-D transform per dim over every line of the tensor. For a tensor of ``numel`` elements
transformed over dims of lengths L1, L2, ...: MACs = round(2.5 · numel · Σ log2 Li) (counted as twice
that in FLOPs, so FLOPs / 2 is exact).
"""
from __future__ import annotations

import math

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

aten = torch.ops.aten


def fft_macs(shape, dims) -> int:
    numel = math.prod(shape)
    return round(2.5 * numel * sum(math.log2(shape[d]) for d in dims if shape[d] > 1))


def _r2c_flop(x_shape, dim, *args, out_shape=None, **kwargs) -> int:
    return 2 * fft_macs(x_shape, dim)


def _c2r_flop(x_shape, dim, *args, out_shape=None, **kwargs) -> int:
    return 2 * fft_macs(out_shape, dim)


def _cpu_sdpa_flop(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(q_shape, k_shape, v_shape)


FFT_FORMULAS = {aten._fft_r2c: _r2c_flop, aten._fft_c2c: _r2c_flop, aten._fft_c2r: _c2r_flop}
# torch counts SDPA on CUDA and meta (its math path) but has no formula for the CPU flash kernel
EXTRA_FORMULAS = {**FFT_FORMULAS, aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flop}


def flop_counter() -> FlopCounterMode:
    """The FLOP counter used everywhere here: torch's, plus the FFT formula above and CPU SDPA."""
    return FlopCounterMode(display=False, custom_mapping=EXTRA_FORMULAS)
