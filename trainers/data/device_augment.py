"""timm's training and evaluation transforms on the trial's device, batched: uint8 images in, normalised float
batches out, each image with randomness of its own drawn as timm draws it.

What timm's ``create_transform`` does to one PIL image (trainers.data.sources.train_transform), done here to a
batch: random resized crop (scale 0.08-1, aspect 3/4-4/3, bilinear), horizontal flip (p 0.5), then timm's
RandAugment when the config names one (``rand-m9-mstd0.5-inc1``: 2 ops a sample, each with p 0.5, among 15,
magnitude ~ N(9, 0.5) clipped to 0-10) or else colour jitter (brightness, contrast, saturation 0.4, in a random
order), normalisation with ImageNet's mean and std, and random erasing (``random_erasing``). Evaluation: resize
the short side to img_size / 0.875 and crop the centre.

Where each part comes from:
- random draws: made on the CPU from a seeded torch.Generator, per sample, with timm's rules (the attempts of its
  crop, its magnitude noise and clipping, its level-to-argument rules: ``rand_ops``), so they replay after a resume;
  the batch's work on the device then only follows them (index lists made on the host: no device sync);
- random resized crop and the evaluation's resize and crop: PIL's resampling (its bilinear filter, antialiased,
  within the box) as two batched matrix products, a box per image (by hand: torchvision's v2 crop draws one box
  per batch, and roi_align samples outside the box);
- RandAugment's ops: ``torchvision.transforms.v2.functional`` where one call serves images that each have their
  own parameters (autocontrast, equalize, per image and channel); by hand where torchvision takes one parameter
  for the batch: PIL's blends (colour, contrast, brightness, sharpness) with a factor per image, posterize,
  solarize and solarize-add with their own level, and the geometric ops (rotate, shear, translate) as one
  ``affine_grid`` / ``grid_sample`` over the images that drew one, filled with timm's mean colour;
- random erasing: timm's own ``RandomErasing`` on the normalised batch (it works on device tensors);
- mixup / cutmix: timm's ``Mixup``, which the training step applies to any batch (trainers.data.datasets).
The ops follow PIL's arithmetic (blend truncation, the L conversion's weights) so that their outputs agree with
timm's on the same input within a grey level or two; the statistics of the draws are checked against timm's own
(tests/trainers/test_device_augment.py, benchmarks/README.md).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from qkvsearch.trainers.data.sources import ERASING_MODE, IMAGENET_MEAN, IMAGENET_STD

CROP_SCALE = (0.08, 1.0)          # timm's random resized crop: area share and aspect ratio ranges
CROP_RATIO = (3 / 4, 4 / 3)
CROP_ATTEMPTS = 10
FLIP_P = 0.5
EVAL_CROP_PCT = 0.875             # timm's default crop_pct: resize to img_size / crop_pct, crop the centre
JITTER = 0.4                      # timm's color_jitter default when no auto_augment (brightness, contrast, saturation)
LEVEL_DENOM = 10.0                # timm's magnitude scale
FILL = tuple(min(255, round(255 * m)) for m in IMAGENET_MEAN)   # timm's img_mean: the geometric ops' fill

# timm's RandAugment op lists (timm.data.auto_augment._RAND_TRANSFORMS, _RAND_INCREASING_TRANSFORMS)
RAND_OPS = ("AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize", "SolarizeAdd", "Color",
            "Contrast", "Brightness", "Sharpness", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")
RAND_OPS_INCREASING = ("AutoContrast", "Equalize", "Invert", "Rotate", "PosterizeIncreasing", "SolarizeIncreasing",
                       "SolarizeAdd", "ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing",
                       "SharpnessIncreasing", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")
GEOMETRIC = ("Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")


class AugmentError(ValueError):
    """A recipe the device path does not run."""


# ---------------------------------------------------------------------------------------------- the recipe


@dataclass(frozen=True)
class RandAugmentSpec:
    """timm's rand-* string, parsed as timm.data.auto_augment.rand_augment_transform parses it."""

    ops: tuple[str, ...]
    magnitude: float = 10.0
    layers: int = 2
    prob: float = 0.5
    magnitude_std: float = 0.0
    magnitude_max: float = LEVEL_DENOM

    @classmethod
    def parse(cls, text: str) -> RandAugmentSpec:
        parts = text.split("-")
        if parts[0] != "rand":
            raise AugmentError(f"randaugment: expected a rand-* string on the device path, given {text!r}")
        magnitude, layers, prob, mstd, mmax, increasing = 10.0, 2, 0.5, 0.0, LEVEL_DENOM, False
        for part in parts[1:]:
            key, *value = re.split(r"(\d.*)", part)
            if not value:
                continue
            value = value[0]
            if key == "mstd":
                mstd = float(value)
                mstd = math.inf if mstd > 100 else mstd
            elif key == "mmax":
                mmax = float(int(value))
            elif key == "inc":
                increasing = bool(int(value))
            elif key == "m":
                magnitude = float(int(value))
            elif key == "n":
                layers = int(value)
            elif key == "p":
                prob = float(value)
            else:  # timm's 't' (op weights) and anything else
                raise AugmentError(f"randaugment: the device path runs timm's m, n, p, mstd, mmax and inc options, "
                                   f"given {part!r} in {text!r}")
        return cls(RAND_OPS_INCREASING if increasing else RAND_OPS, magnitude, layers, prob, mstd, mmax)


@dataclass(frozen=True)
class Recipe:
    """What a config's training split gets (trainers.data.sources.train_transform's recipe) on the device."""

    img_size: int
    train: bool                          # random crop and flip and the rest; False: resize and centre crop
    randaugment: RandAugmentSpec | None = None
    jitter: float = 0.0                  # colour jitter strength (timm's, when no RandAugment)
    erasing: float = 0.0                 # random erasing probability

    @classmethod
    def training(cls, cfg: dict) -> Recipe:
        from qkvsearch.trainers.data.sources import augments

        if not augments(cfg):
            return cls.evaluation(cfg)
        ra = RandAugmentSpec.parse(cfg["randaugment"]) if cfg["randaugment"] else None
        return cls(cfg["img_size"], True, ra, 0.0 if ra else JITTER, float(cfg.get("random_erasing") or 0.0))

    @classmethod
    def evaluation(cls, cfg: dict) -> Recipe:
        return cls(cfg["img_size"], False)


# ---------------------------------------------------------------------------------------------- the draws


@dataclass
class Draws:
    """One batch's random parameters, per sample (CPU tensors): crop rows (B, 8) float64: the box x1 y1 x2 y2 in the
    source image's pixels, the size (width, height) it is resized to, and the left and top of the img_size window
    of that resized box kept (training: the box resized to img_size, all kept); flips (B,) bool, RandAugment's
    op indices (layers, B) (-1: the layer did nothing) and their magnitudes (layers, B), the colour jitter's
    order (B, 3) and factors (B, 3)."""

    boxes: torch.Tensor
    flips: torch.Tensor
    ops: torch.Tensor | None = None
    magnitudes: torch.Tensor | None = None
    signs: torch.Tensor | None = None
    jitter_order: torch.Tensor | None = None
    jitter_factors: torch.Tensor | None = None


def crop_boxes(sizes: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """timm's RandomResizedCropAndInterpolation.get_params for each (h, w) of ``sizes`` (B, 2): up to 10 attempts
    at an area share in CROP_SCALE and a log-uniform aspect in CROP_RATIO, rounded, the first that fits; a
    random place for it (inclusive ranges); else the centre crop at the nearest allowed aspect. -> (B, 4) float
    boxes x1 y1 x2 y2."""
    b = len(sizes)
    h, w = sizes[:, 0].double(), sizes[:, 1].double()
    area = (h * w)[:, None]
    scale = CROP_SCALE[0] + (CROP_SCALE[1] - CROP_SCALE[0]) * torch.rand(b, CROP_ATTEMPTS, generator=g,
                                                                         dtype=torch.float64)
    lo, hi = math.log(CROP_RATIO[0]), math.log(CROP_RATIO[1])
    aspect = torch.exp(lo + (hi - lo) * torch.rand(b, CROP_ATTEMPTS, generator=g, dtype=torch.float64))
    tw = torch.round(torch.sqrt(scale * area * aspect))
    th = torch.round(torch.sqrt(scale * area / aspect))
    fits = (tw <= w[:, None]) & (th <= h[:, None])
    first = torch.where(fits.any(1), fits.double().argmax(1), torch.full((b,), -1))
    rows = torch.arange(b)
    cw, ch = tw[rows, first.clamp(min=0)], th[rows, first.clamp(min=0)]
    u = torch.rand(b, 2, generator=g, dtype=torch.float64)
    top = torch.floor(u[:, 0] * (h - ch + 1))
    left = torch.floor(u[:, 1] * (w - cw + 1))
    # the fallback: the centre crop, clamped to the aspect range
    ratio = w / h
    fw = torch.where(ratio < CROP_RATIO[0], w, torch.where(ratio > CROP_RATIO[1], torch.round(h * CROP_RATIO[1]), w))
    fh = torch.where(ratio < CROP_RATIO[0], torch.round(w / CROP_RATIO[0]), h)
    ftop, fleft = torch.floor((h - fh) / 2), torch.floor((w - fw) / 2)
    miss = first < 0
    cw, ch = torch.where(miss, fw, cw), torch.where(miss, fh, ch)
    top, left = torch.where(miss, ftop, top), torch.where(miss, fleft, left)
    return torch.stack([left, top, left + cw, top + ch], 1)


def centre_boxes(sizes: torch.Tensor, img_size: int) -> torch.Tensor:
    """The evaluation's resize and crop as crop rows (``Draws.boxes``): the whole image resized so that its short side
    is floor(img_size / crop_pct) (the long side truncated, as torchvision's Resize), and the img_size window at its
    centre (CenterCrop's rounding)."""
    h, w = sizes[:, 0].double(), sizes[:, 1].double()
    short = math.floor(img_size / EVAL_CROP_PCT)
    nh = torch.where(h <= w, torch.full_like(h, short), torch.floor(short * h / w))
    nw = torch.where(h <= w, torch.floor(short * w / h), torch.full_like(w, short))
    top, left = torch.round((nh - img_size) / 2), torch.round((nw - img_size) / 2)
    zero = torch.zeros_like(h)
    return torch.stack([zero, zero, w, h, nw, nh, left, top], 1)


def resize_weights(start, stop, size, offset, out: int, extent: int) -> torch.Tensor:
    """PIL's resampling coefficients (Resample.c, bilinear) along one axis, per image: the source span [start, stop)
    resized to ``size`` pixels, of which those from ``offset`` on (``out`` of them) are kept, the filter cut at the
    span's pixels as when PIL resizes a crop (a span of fractional ends keeps the pixels it touches); -> (B, out,
    extent) float64 weights over the canvas's ``extent`` pixels, each row summing to 1."""
    scale = ((stop - start) / size)[:, None]                             # (B, 1)
    fscale = scale.clamp(min=1.0)
    center = start[:, None] + (offset[:, None] + torch.arange(out, dtype=torch.float64) + 0.5) * scale   # (B, out)
    lo = torch.maximum(torch.trunc(center - fscale + 0.5), torch.floor(start)[:, None])
    hi = torch.minimum(torch.trunc(center + fscale + 0.5), torch.ceil(stop)[:, None])
    pos = torch.arange(extent, dtype=torch.float64)[None, None]         # (1, 1, extent)
    c, lo, hi = center[..., None], lo[..., None], hi[..., None]
    w = (1 - ((pos - c + 0.5) / fscale[..., None]).abs()).clamp(min=0) * ((pos >= lo) & (pos < hi))
    return w / w.sum(-1, keepdim=True).clamp(min=1e-12)


def rand_ops(spec: RandAugmentSpec, b: int, g: torch.Generator):
    """RandAugment's draws for ``b`` images: per layer an op uniformly among spec.ops (with replacement, as
    numpy's choice without weights), applied with spec.prob, its magnitude ~ N(m, mstd) (uniform(0, m) when
    mstd is inf) clipped to [0, mmax], and the sign its level may take. -> (ops (layers, b) int64, -1 where
    skipped; magnitudes (layers, b); signs (layers, b) of +-1)."""
    n = spec.layers
    ops = torch.randint(0, len(spec.ops), (n, b), generator=g)
    applied = torch.rand(n, b, generator=g, dtype=torch.float64) <= spec.prob
    if math.isinf(spec.magnitude_std):
        mag = spec.magnitude * torch.rand(n, b, generator=g, dtype=torch.float64)
    elif spec.magnitude_std > 0:
        mag = spec.magnitude + spec.magnitude_std * torch.randn(n, b, generator=g, dtype=torch.float64)
    else:
        mag = torch.full((n, b), spec.magnitude, dtype=torch.float64)
    mag = mag.clamp(0.0, spec.magnitude_max or LEVEL_DENOM)
    signs = torch.where(torch.rand(n, b, generator=g, dtype=torch.float64) > 0.5, -1.0, 1.0)
    return torch.where(applied, ops, -1), mag, signs


def level_args(name: str, magnitude: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    """timm's LEVEL_TO_ARG for op ``name`` over a vector of magnitudes (float64) -> its argument per image: degrees,
    bits kept, threshold, amount added, enhance factor, shear factor or translation share."""
    level = magnitude / LEVEL_DENOM
    if name == "Rotate":
        return level * 30.0 * signs
    if name == "Posterize":          # the host path keeps at least a bit (sources._posterize_keeps_a_bit)
        return torch.floor(level * 4).clamp(min=1)
    if name == "PosterizeIncreasing":
        return (4 - torch.floor(level * 4)).clamp(min=1)
    if name == "Solarize":
        return torch.floor(level * 256).clamp(max=256)
    if name == "SolarizeIncreasing":
        return 256 - torch.floor(level * 256).clamp(max=256)
    if name == "SolarizeAdd":
        return torch.floor(level * 110).clamp(max=128)
    if name in ("Color", "Contrast", "Brightness", "Sharpness"):
        return level * 1.8 + 0.1
    if name.endswith("Increasing"):  # ColorIncreasing & co
        return (1.0 + level * 0.9 * signs).clamp(min=0.1)
    if name in ("ShearX", "ShearY"):
        return level * 0.3 * signs
    if name in ("TranslateXRel", "TranslateYRel"):
        return level * 0.45 * signs
    return torch.zeros_like(magnitude)   # AutoContrast, Equalize, Invert take none


def draw(recipe: Recipe, sizes: torch.Tensor, g: torch.Generator) -> Draws:
    """Every random parameter of one batch of images of (h, w) ``sizes`` (B, 2), drawn on the CPU from ``g``."""
    b = len(sizes)
    if not recipe.train:
        return Draws(centre_boxes(sizes, recipe.img_size), torch.zeros(b, dtype=torch.bool))
    s = float(recipe.img_size)
    box = crop_boxes(sizes, g)
    boxes = torch.cat([box, torch.tensor([s, s, 0.0, 0.0], dtype=box.dtype).expand(b, 4)], 1)
    flips = torch.rand(b, generator=g) < FLIP_P
    out = Draws(boxes, flips)
    if recipe.randaugment is not None:
        out.ops, out.magnitudes, out.signs = rand_ops(recipe.randaugment, b, g)
    elif recipe.jitter:
        out.jitter_order = torch.argsort(torch.rand(b, 3, generator=g), dim=1)   # a random permutation each
        out.jitter_factors = 1 - recipe.jitter + 2 * recipe.jitter * torch.rand(b, 3, generator=g, dtype=torch.float64)
    return out


# ---------------------------------------------------------------------------------------------- the ops


def gray(x: torch.Tensor) -> torch.Tensor:
    """PIL's RGB -> L (ITU-R 601-2, rounded): uint8-valued float (B, 1, H, W) of float (B, 3, H, W) in 0..255."""
    return torch.floor((x[:, 0:1] * 19595 + x[:, 1:2] * 38470 + x[:, 2:3] * 7471 + 32768) / 65536)


def blend(image: torch.Tensor, degenerate: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """PIL's Image.blend(degenerate, image, factor) (ImageEnhance): degenerate + factor (image - degenerate),
    clipped and truncated to grey levels; factor (B,) one per image."""
    f = factor.to(image.dtype).view(-1, 1, 1, 1)
    return torch.floor((degenerate + f * (image - degenerate)).clamp(0, 255))


def enhance(name: str, x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """PIL's ImageEnhance Color, Contrast, Brightness or Sharpness with a factor per image, on float (B, 3, H, W)
    grey levels."""
    if name.startswith("Color"):
        return blend(x, gray(x).expand_as(x), factor)
    if name.startswith("Contrast"):
        mean = torch.floor(gray(x).mean(dim=(1, 2, 3), keepdim=True) + 0.5)
        return blend(x, mean.expand_as(x), factor)
    if name.startswith("Brightness"):
        return blend(x, torch.zeros_like(x), factor)
    # Sharpness: PIL's SMOOTH filter (1 1 1 / 1 5 1 / 1 1 1, / 13, rounded) inside, the border kept
    kernel = torch.tensor([[1.0, 1, 1], [1, 5, 1], [1, 1, 1]], device=x.device, dtype=x.dtype) / 13
    smooth = x.clone()
    smooth[..., 1:-1, 1:-1] = torch.round(F.conv2d(x, kernel.expand(3, 1, 3, 3), groups=3))
    return blend(x, smooth, factor)


def affine_theta(name: str, arg: torch.Tensor, size: int) -> torch.Tensor:
    """(B, 2, 3) affine_grid matrices of PIL's transform for each image of side ``size``: PIL maps an output
    point (x, y) (pixel centres at +0.5) to the input point (a x + b y + c, d x + e y + f)."""
    one, zero = torch.ones_like(arg), torch.zeros_like(arg)
    if name == "Rotate":   # Image.rotate: counter-clockwise about the centre
        t = -torch.deg2rad(arg)
        a, b, d, e = torch.cos(t), torch.sin(t), -torch.sin(t), torch.cos(t)
        cx = cy = size / 2.0
        c = a * -cx + b * -cy + cx
        f = d * -cx + e * -cy + cy
    elif name == "ShearX":
        a, b, c, d, e, f = one, arg, zero, zero, one, zero
    elif name == "ShearY":
        a, b, c, d, e, f = one, zero, zero, arg, one, zero
    elif name == "TranslateXRel":
        a, b, c, d, e, f = one, zero, arg * size, zero, one, zero
    else:  # TranslateYRel
        a, b, c, d, e, f = one, zero, zero, zero, one, arg * size
    # pixel coordinates -> affine_grid's [-1, 1] (align_corners=False) on a square image
    row0 = torch.stack([a, b, a + b + 2 * c / size - 1], 1)
    row1 = torch.stack([d, e, d + e + 2 * f / size - 1], 1)
    return torch.stack([row0, row1], 1)


def geometric(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Resample float (B, 3, S, S) grey levels at theta's points, bilinear, PIL's fill (FILL) where a point falls
    outside the image, truncated to grey levels as PIL does."""
    grid = F.affine_grid(theta.to(x.dtype), list(x.shape), align_corners=False)
    out = F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
    eps = 1e-5   # PIL samples a point when 0 <= x < width (pixel coordinates): [-1, 1) here, float error aside
    inside = ((grid >= -1 - eps) & (grid < 1 - eps)).all(dim=-1, keepdim=True).permute(0, 3, 1, 2)
    fill = torch.tensor(FILL, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
    return torch.floor(torch.where(inside, out, fill))


def apply_op(name: str, x: torch.Tensor, arg: torch.Tensor) -> torch.Tensor:
    """RandAugment's op ``name`` on float (B, 3, S, S) grey levels, ``arg`` (B,) float64 its argument per image."""
    from torchvision.transforms.v2 import functional as TF

    if name == "AutoContrast":
        return TF.autocontrast(x.to(torch.uint8)).to(x.dtype)
    if name == "Equalize":
        return TF.equalize(x.to(torch.uint8)).to(x.dtype)
    if name == "Invert":
        return 255 - x
    a = arg.to(device=x.device)
    if name.startswith("Posterize"):
        mask = ((255 << (8 - a.long())) & 255).to(torch.uint8).view(-1, 1, 1, 1)
        return (x.to(torch.uint8) & mask).to(x.dtype)
    if name.startswith("Solarize") and name != "SolarizeAdd":
        t = a.to(x.dtype).view(-1, 1, 1, 1)
        return torch.where(x >= t, 255 - x, x)
    if name == "SolarizeAdd":
        add = a.to(x.dtype).view(-1, 1, 1, 1)
        return torch.where(x < 128, (x + add).clamp(max=255), x)
    if name in GEOMETRIC:
        return geometric(x, affine_theta(name, a.double(), x.shape[-1]))
    return enhance(name, x, a)


# ---------------------------------------------------------------------------------------------- the batch


def _on(index: torch.Tensor, device) -> torch.Tensor:
    return index.to(device, non_blocking=True)


class DeviceAugment:
    """A recipe applied to batches: ``__call__(images, sizes, g)`` -> float (B, 3, S, S), normalised.

    images: uint8 (B, C, H, W) on the device, image i in its top-left sizes[i] = (h, w) (C 1 or 3; 1 is
    repeated to RGB); sizes: int (B, 2) on the CPU; g: the generator every draw comes from (CPU)."""

    def __init__(self, recipe: Recipe):
        self.recipe = recipe
        self.erasing = None
        if recipe.erasing > 0:
            from timm.data.random_erasing import RandomErasing

            self.erasing = RandomErasing(recipe.erasing, mode=ERASING_MODE, device="cpu")

    def __call__(self, images: torch.Tensor, sizes: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        d = draw(self.recipe, sizes, g)
        x = self.crop(images, d.boxes)
        x = self.augment(x, d)
        return self.finish(x)

    def crop(self, images: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        """Each image's box resized and windowed (``Draws.boxes``) to S x S, as PIL crops then resizes (bilinear,
        antialiased when shrinking: its triangle filter widened by the scale, the weights normalised within the box,
        each pass rounded to grey levels): two batched matrix products, horizontal then vertical."""
        s = self.recipe.img_size
        x = images.float()
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        b = boxes.double()
        if b.shape[1] == 4:   # a box resized to S x S, all kept
            b = torch.cat([b, torch.tensor([s, s, 0.0, 0.0], dtype=b.dtype).expand(len(b), 4)], 1)
        wh = resize_weights(b[:, 0], b[:, 2], b[:, 4], b[:, 6], s, x.shape[-1]).to(x.device, torch.float32)
        wv = resize_weights(b[:, 1], b[:, 3], b[:, 5], b[:, 7], s, x.shape[-2]).to(x.device, torch.float32)
        rows = torch.round(torch.matmul(x, wh.transpose(1, 2)[:, None]))    # (B, 3, H, S)
        return torch.round(torch.matmul(wv[:, None], rows)).clamp_(0, 255)   # (B, 3, S, S)

    def augment(self, x: torch.Tensor, d: Draws) -> torch.Tensor:
        """Flip, then RandAugment or colour jitter, per image, on float (B, 3, S, S) grey levels."""
        if d.flips.any():
            flip = _on(d.flips, x.device).view(-1, 1, 1, 1)
            x = torch.where(flip, x.flip(-1), x)
        if d.ops is not None:
            spec = self.recipe.randaugment
            for layer in range(len(d.ops)):
                x = self._layer(x, spec.ops, d.ops[layer], d.magnitudes[layer], d.signs[layer])
        elif d.jitter_order is not None:
            names = ("Brightness", "Contrast", "Color")   # torchvision's ColorJitter: brightness, contrast, saturation
            for step in range(3):
                for k, name in enumerate(names):
                    idx = torch.nonzero(d.jitter_order[:, step] == k).flatten()
                    if len(idx):
                        on = _on(idx, x.device)
                        x[on] = enhance(name, x[on], d.jitter_factors[idx, k])
        return x

    @staticmethod
    def _layer(x, names, ops, magnitudes, signs):
        for k, name in enumerate(names):
            idx = torch.nonzero(ops == k).flatten()
            if len(idx):
                on = _on(idx, x.device)
                x[on] = apply_op(name, x[on], level_args(name, magnitudes[idx], signs[idx]))
        return x

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        """Grey levels -> ImageNet-normalised floats, then random erasing (timm's, on the batch)."""
        mean = torch.tensor(IMAGENET_MEAN, device=x.device).view(1, 3, 1, 1) * 255
        std = torch.tensor(IMAGENET_STD, device=x.device).view(1, 3, 1, 1) * 255
        x = (x - mean) / std
        if self.erasing is not None:
            self.erasing.device = x.device
            x = self.erasing(x)
        return x
