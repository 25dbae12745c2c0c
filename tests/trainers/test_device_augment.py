"""The device path's augmentation against timm's own (trainers.data.device_augment): each RandAugment op on a batch
gives what timm's PIL op gives on each image; the crop resizes a box as PIL does; and the random draws follow
timm's distributions (crop area and aspect, flips, which RandAugment ops and with which arguments), compared over a
few thousand draws of each with two-sample tests at a level that a correct implementation fails once in 10^4."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from PIL import Image
from scipy import stats

from qkvsearch.trainers.data import device_augment as da

ALPHA = 1e-4   # per comparison: a faithful draw fails about once in 10^4 runs
RA = "rand-m9-mstd0.5-inc1"


def _photos(n: int, side: int, seed: int = 0) -> list[np.ndarray]:
    """Smooth random colour fields with pixel noise (edges and flat areas, as photos have), (side, side, 3) uint8."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        coarse = rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)
        a = np.asarray(Image.fromarray(coarse).resize((side, side), Image.BICUBIC), dtype=np.float32)
        out.append(np.clip(a + rng.normal(0, 8, a.shape), 0, 255).astype(np.uint8))
    return out


def _timm_op(name, pil, arg):
    from timm.data import auto_augment as aa

    fn = aa.NAME_TO_OP[name]
    if name in ("AutoContrast", "Equalize", "Invert"):
        return fn(pil)
    if name.startswith(("Posterize", "Solarize")):
        return fn(pil, int(arg))
    return fn(pil, float(arg), fillcolor=da.FILL, resample=Image.BILINEAR)


@pytest.mark.parametrize("name", da.RAND_OPS_INCREASING + ("Posterize", "Solarize", "Color", "Contrast"))
def test_each_randaugment_op_on_a_batch_gives_what_timm_gives_each_image(name):
    images = _photos(8, 40)
    x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float()
    mags = torch.tensor([2.0, 5.0, 7.5, 9.0, 10.0, 8.6, 9.4, 0.0], dtype=torch.float64)
    signs = torch.tensor([1.0, -1.0] * 4, dtype=torch.float64)
    args = da.level_args(name, mags, signs)
    got = da.apply_op(name, x.clone(), args).permute(0, 2, 3, 1).numpy()
    want = np.stack([np.asarray(_timm_op(name, Image.fromarray(im), a)) for im, a in zip(images, args.tolist())])
    diff = np.abs(got - want.astype(np.float32))
    if name in da.GEOMETRIC:   # bilinear resampling: a grey level apart at a few pixels, float rounding
        assert diff.max() <= 1 and diff.mean() < 0.05, (diff.max(), diff.mean())
    else:                      # PIL's arithmetic, reproduced
        assert diff.max() <= 1 and diff.mean() < 1e-3, (diff.max(), diff.mean())


def test_the_crop_resizes_a_box_as_pil_crops_and_resizes_it():
    images = _photos(6, 96, seed=1)
    aug = da.DeviceAugment(da.Recipe(32, True))
    rng = random.Random(0)
    for im in images:
        top, left, h, w = rng.randint(0, 40), rng.randint(0, 40), rng.randint(10, 56), rng.randint(10, 56)
        want = np.asarray(Image.fromarray(im).crop((left, top, left + w, top + h)).resize((32, 32), Image.BILINEAR))
        got = aug.crop(torch.from_numpy(im).permute(2, 0, 1)[None], torch.tensor([[left, top, left + w, top + h]],
                       dtype=torch.float32))[0].permute(1, 2, 0).numpy()
        diff = np.abs(got - want.astype(np.float64))
        assert diff.max() <= 1 and diff.mean() < 0.3, (diff.max(), diff.mean())   # PIL rounds its fixed-point sums


def test_a_box_at_an_images_edge_in_a_larger_batch_canvas_is_resized_as_pil_resizes_it():
    from qkvsearch.trainers.data.device_source import canvas

    small, large = _photos(1, 30, seed=3)[0], _photos(1, 64, seed=4)[0]
    images, sizes = canvas([small, large])
    box = (12, 9, 30, 30)   # to the small image's right and bottom edges, enlarged to 32 x 32
    want = np.asarray(Image.fromarray(small).crop(box).resize((32, 32), Image.BILINEAR)).astype(np.float64)
    got = da.DeviceAugment(da.Recipe(32, True)).crop(images.permute(0, 3, 1, 2), torch.tensor(
        [box, (0, 0, 64, 64)], dtype=torch.float32))[0].permute(1, 2, 0).numpy()
    assert np.abs(got - want).max() <= 1, np.abs(got - want).max()
    assert sizes.tolist() == [[30, 30], [64, 64]]


def test_evaluation_reads_an_image_resized_to_the_prepared_side_exactly_as_timm_evaluates_it():
    from qkvsearch.trainers.data.prepared import resized, short_side
    from qkvsearch.trainers.data.sources import eval_transform

    cfg = {"img_size": 32}
    rng = np.random.default_rng(2)
    for h, w in ((50, 70), (64, 41), (37, 37)):
        im = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        want = eval_transform(cfg)(Image.fromarray(im))   # normalised (3, 32, 32)
        stored = resized(im, short_side(32))
        aug = da.DeviceAugment(da.Recipe.evaluation(cfg))
        got = aug(torch.from_numpy(stored).permute(2, 0, 1)[None], torch.tensor([stored.shape[:2]]),
                  torch.Generator())[0]
        assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


def _timm_crops(sizes, n):
    from timm.data.transforms import RandomResizedCropAndInterpolation as RRC

    random.seed(0)
    out = []
    for k in range(n):
        h, w = sizes[k % len(sizes)]
        i, j, ch, cw = RRC.get_params(Image.new("RGB", (w, h)), da.CROP_SCALE, da.CROP_RATIO)
        out.append((cw * ch / (w * h), math.log(cw / ch), j / max(w - cw, 1), i / max(h - ch, 1)))
    return np.asarray(out)


def test_crop_areas_aspects_places_and_flips_follow_timms_distributions():
    n, sizes = 4000, [(30, 40), (40, 30), (64, 20), (24, 24)]   # 64 x 20: timm's fallback centre crop too
    timm = _timm_crops(sizes, n)
    hw = torch.tensor([sizes[k % len(sizes)] for k in range(n)])
    d = da.draw(da.Recipe(16, True), hw, torch.Generator().manual_seed(0))
    b = d.boxes.double()
    cw, ch = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
    h, w = hw[:, 0].double(), hw[:, 1].double()
    mine = torch.stack([cw * ch / (w * h), torch.log(cw / ch), b[:, 0] / (w - cw).clamp(min=1),
                        b[:, 1] / (h - ch).clamp(min=1)], 1).numpy()
    for col, what in enumerate(("area share", "log aspect", "left place", "top place")):
        p = stats.ks_2samp(timm[:, col], mine[:, col]).pvalue
        assert p > ALPHA, (what, p)
    flips = d.flips.double().mean().item()   # timm's RandomHorizontalFlip: p 0.5
    assert abs(flips - 0.5) < 4 * math.sqrt(0.25 / n), flips


def _timm_randaugment_calls(n: int) -> list[tuple[str, float]]:
    """(op, its argument) of every op timm's rand-m9-mstd0.5-inc1 applies to n images: timm's own transform, each
    of its ops' functions wrapped to note the call."""
    from timm.data.auto_augment import rand_augment_transform

    ra = rand_augment_transform(RA, {"translate_const": 100, "img_mean": da.FILL, "interpolation": Image.BILINEAR})
    calls = []
    for op in ra.ops:
        def noted(img, *args, _name=op.name, **kw):
            calls.append((_name, float(args[0]) if args else 0.0))
            return img
        op.aug_fn = noted
    random.seed(0)
    np.random.seed(0)
    img = Image.new("RGB", (8, 8))
    for _ in range(n):
        ra(img)
    return calls


def test_randaugment_ops_and_their_arguments_follow_timms_distributions():
    n = 6000
    timm = _timm_randaugment_calls(n)
    spec = da.RandAugmentSpec.parse(RA)
    ops, mags, signs = da.rand_ops(spec, n, torch.Generator().manual_seed(0))
    mine = []
    for layer in range(spec.layers):
        for k, name in enumerate(spec.ops):
            on = ops[layer] == k
            mine += [(name, float(a)) for a in da.level_args(name, mags[layer][on], signs[layer][on])]
    # how often each op is applied: one contingency table, timm's counts against these
    names = list(spec.ops)
    table = np.array([[sum(1 for c in calls if c[0] == name) for name in names] for calls in (timm, mine)])
    assert stats.chi2_contingency(table).pvalue > ALPHA, table
    assert abs(len(mine) / (2 * n) - 0.5) < 4 * math.sqrt(0.25 / (2 * n))   # each layer applied with p 0.5
    for name in names:   # each op's argument: its distribution (magnitude noise, clipping, sign)
        a = [v for c, v in timm if c == name]
        b = [v for c, v in mine if c == name]
        if len(set(a)) > 1:
            assert stats.ks_2samp(a, b).pvalue > ALPHA, name
        else:
            assert set(a) == set(b), name


def test_random_erasing_is_timms_on_the_batch_and_erases_its_share():
    random.seed(0)
    torch.manual_seed(0)
    n = 2000
    grey = torch.full((n, 3, 16, 16), 128.0)
    plain = da.DeviceAugment(da.Recipe(16, True)).finish(grey.clone())
    out = da.DeviceAugment(da.Recipe(16, True, erasing=0.25)).finish(grey.clone())
    changed = (out != plain).flatten(1)
    share = changed.any(1).double().mean().item()
    assert abs(share - 0.25) < 4 * math.sqrt(0.25 * 0.75 / n), share
    area = changed.double().mean(1)[changed.any(1)]   # timm: 2 % to 1/3 of the image, rounded to pixels
    assert area.min() >= 0.01 and area.max() <= 0.4 and 0.1 < area.mean() < 0.25, area.mean()   # boxes rounded
