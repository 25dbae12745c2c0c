"""Quantization policies (trainers.model.quantize, torchao): each precision quantizes exactly the parts it names, a
block's own precision exactly that block's part, an MLP-Mixer's token-mixing MLPs as a part of their own, the
plain-linear forms of SNE and F-SNE compute what the embeddings do, the counted size is what torch.save stores,
a policy on a part the model lacks is refused naming its key, and the measured path measures the model as
deployed."""
from __future__ import annotations

import copy
import io
import zipfile

import pytest
import torch
from torch import nn
from torchao.quantization import Int8Tensor

from qkvsearch.spaces.keys import QUANT_KEYS, ConfigError, fill
from qkvsearch.trainers import build_model
from qkvsearch.trainers.model.cost import resolve_trial
from qkvsearch.trainers.model.embeddings import FSNE, SNE, GroupedLinear
from qkvsearch.trainers.model.quantize import (
    FSNELinears,
    SNELinears,
    linear_forms,
    part_linears,
    quantize_model,
    weights_bytes,
)

BASE = {"model": "xcit_nano_12_p8_224", "img_size": 16, "num_classes": 10, "epochs": 1}


def _config(**keys) -> dict:
    return resolve_trial({**BASE, **keys})[0]


@pytest.fixture(scope="module")
def sne_model():
    torch.manual_seed(0)
    return build_model(_config(embedding="sne", embed_class_attn=True)).eval()


def _int8(model: nn.Module) -> dict[str, str]:
    """linear name -> "dynamic" | "weight_only" for every linear whose weight torchao quantized."""
    return {n: "dynamic" if m.weight.act_quant_kwargs is not None else "weight_only"
            for n, m in model.named_modules() if isinstance(m, nn.Linear) and isinstance(m.weight, Int8Tensor)}


# The parts of XCiT-N12 with SNE in its class attention too: 12 XCA blocks (an SNE's fc1 and its three fc2) + 2
# class-attention blocks (their q, k and v maps apart, each an SNE of one part: fc1 and one fc2; the MLP's fc1 and
# fc2); an MLP-Mixer's token-mixing MLPs are the one part it lacks.
XCIT_PARTS = {"quant_qkv": 12 * 4 + 2 * 3 * 2, "quant_proj": 14, "quant_mlp": 28}
MIXER_ONLY = "quant_token_mlp"


def test_every_part_is_tested_on_a_model_that_has_it():
    assert set(QUANT_KEYS) == {*XCIT_PARTS, MIXER_ONLY}


@pytest.mark.parametrize("key", XCIT_PARTS)
@pytest.mark.parametrize("precision", ["int8_weight_only", "int8_dynamic"])
def test_each_precision_quantizes_exactly_the_part_it_names(sne_model, key, precision):
    cfg = _config(embedding="sne", embed_class_attn=True, **{key: precision})
    model = quantize_model(copy.deepcopy(sne_model), cfg, "cpu")
    parts = part_linears(model)
    assert len(parts[key]) == XCIT_PARTS[key] and not parts[MIXER_ONLY]
    kind = "dynamic" if precision == "int8_dynamic" else "weight_only"
    assert _int8(model) == dict.fromkeys(parts[key], kind)  # the head, the other parts: untouched
    assert not any(isinstance(m, (SNE, GroupedLinear)) for m in model.modules())  # SNE in its linear form
    assert all(type(m.weight) is nn.Parameter for m in model.modules() if isinstance(m, nn.Conv2d))
    assert type(model.head.weight) is nn.Parameter and model.head.weight.dtype == torch.float32


def _kinds(model: nn.Module) -> dict:
    """(block, part) -> the set of int8 kinds of its linears ({None}: none quantized), read off the module tree:
    block i of ``blocks`` or "cls" (XCiT's class attention); part qkv, proj, mlp, token_mlp by the path."""
    out: dict = {}
    for name, m in model.named_modules():
        if not isinstance(m, nn.Linear) or name == "head":
            continue
        site, index, *rest = name.split(".")
        block = int(index) if site == "blocks" else "cls"
        part = "token_mlp" if rest[0] == "mlp_tokens" else "mlp" if rest[0].startswith("mlp") else \
            "proj" if rest[-1] == "proj" else "qkv"
        kind = None if not isinstance(m.weight, Int8Tensor) else \
            "dynamic" if m.weight.act_quant_kwargs is not None else "weight_only"
        out.setdefault((block, part), set()).add(kind)
    return out


def test_a_blocks_own_precision_quantizes_exactly_that_blocks_part():
    """The part's precision in every block without its own (class attention, outside ``blocks``, included); a
    block's own where it has one: fp under a quantized part, or a precision under an fp part."""
    torch.manual_seed(0)
    cfg = _config(embedding="sne", embed_class_attn=True, depth=3, quant_qkv="int8_dynamic", **{
        "quant_qkv.1": "fp", "quant_proj.0": "int8_weight_only", "quant_mlp.2": "int8_dynamic"})
    model = quantize_model(build_model(cfg).eval(), cfg, "cpu")
    expected = {0: {"qkv": "dynamic", "proj": "weight_only", "mlp": None},
                1: {"qkv": None, "proj": None, "mlp": None},
                2: {"qkv": "dynamic", "proj": None, "mlp": "dynamic"},
                "cls": {"qkv": "dynamic", "proj": None, "mlp": None}}
    assert _kinds(model) == {(b, part): {kind} for b, parts in expected.items() for part, kind in parts.items()}
    assert all(type(model.blocks[b].attn.qkv) is SNELinears for b in range(3))   # every block's SNE in linear form


def test_an_mlp_mixers_token_mixing_mlps_are_a_part_of_their_own():
    """quant_token_mlp reaches the token-mixing MLPs (per block too); quant_mlp, the channel MLPs alone, as it did
    before the part existed."""
    torch.manual_seed(0)
    mixer = {"model": "mixer_s16_224", "img_size": 32, "depth": 2, "embed_dim": 32, "patch_size": 4}   # 64 tokens
    cfg = _config(**mixer, quant_token_mlp="int8_weight_only", **{"quant_token_mlp.0": "fp",
                                                                  "quant_mlp.1": "int8_dynamic"})
    model = quantize_model(build_model(cfg).eval(), cfg, "cpu")
    assert _kinds(model) == {(0, "token_mlp"): {None}, (0, "mlp"): {None}, (1, "token_mlp"): {"weight_only"},
                             (1, "mlp"): {"dynamic"}}
    channels = _config(**mixer, quant_mlp="int8_dynamic")
    both = {**channels, "quant_token_mlp": "int8_dynamic"}
    fp = build_model(channels).eval()
    assert weights_bytes(quantize_model(copy.deepcopy(fp), both, "cpu")) < \
        weights_bytes(quantize_model(copy.deepcopy(fp), channels, "cpu")) < weights_bytes(fp)


def test_the_plain_linear_forms_compute_what_the_embeddings_compute():
    x = torch.randn(3, 3, 16, 16)
    for keys in ({"embedding": "sne"}, {"embedding": "fsne", "code_sharing": "per_block", "embed_class_attn": True},
                 {"embedding": "fsne"}):
        torch.manual_seed(0)
        model = build_model(_config(**keys, depth=2)).eval()  # 2 blocks: a per-block code differs by block
        with torch.no_grad():
            for p in model.parameters():  # trained-looking weights, codes included
                p.add_(0.05 * torch.randn_like(p))
            ref = model(x)
            formed = linear_forms(copy.deepcopy(model))
            assert not any(isinstance(m, (SNE, FSNE, GroupedLinear)) for m in formed.modules()), keys
            if keys["embedding"] in ("sne", "fsne"):
                assert any(isinstance(m, (SNELinears, FSNELinears)) for m in formed.modules())
            torch.testing.assert_close(formed(x), ref, rtol=1e-5, atol=1e-5, msg=str(keys))


def _stored_bytes(model: nn.Module) -> int:
    """What torch.save writes of the state_dict's tensors: the archive's data records."""
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
        return sum(i.file_size for i in z.infolist() if "/data/" in i.filename)


def test_the_counted_size_is_what_torch_save_stores(sne_model):
    full = _stored_bytes(sne_model)
    assert weights_bytes(sne_model) == full
    mixed = _config(embedding="sne", embed_class_attn=True, quant_qkv="int8_dynamic", quant_mlp="int8_weight_only")
    model = quantize_model(copy.deepcopy(sne_model), mixed, "cpu")
    assert weights_bytes(model) == _stored_bytes(model) < 0.5 * full  # int8 data and a scale per row


@pytest.mark.parametrize("keys, named", [
    ({"model": "mixer_s16_224", "img_size": 32, "quant_qkv": "int8_dynamic"},
     "quant_qkv: expected fp with model mixer"),
    ({"model": "mixer_s16_224", "img_size": 32, "quant_proj": "int8_weight_only"}, "quant_proj: expected fp"),
    ({"model": "vit_tiny_patch16_224", "attention": "fnet", "quant_proj": "int8_dynamic"},
     "quant_proj: expected fp with attention fnet"),
    ({"model": "vit_tiny_patch16_224", "key": "manifold", "quant_qkv": "int8_dynamic"},
     "quant_qkv: expected fp with key manifold"),
    ({"quant_mlp": "int4"}, 'quant_mlp: expected one of fp, int8_weight_only, int8_dynamic, given "int4"'),
    ({"quant_token_mlp": "int8_dynamic"}, "quant_token_mlp: expected fp with model xcit_nano_12_p8_224 "),
    ({"model": "vit_tiny_patch16_224", "quant_token_mlp.2": "int8_dynamic"},
     "quant_token_mlp.2: expected fp with model vit_tiny_patch16_224 "),
    ({"model": "mixer_s16_224", "img_size": 32, "quant_qkv.0": "int8_dynamic"},
     "quant_qkv.0: expected fp with model mixer_s16_224"),
    ({"depth": 2, "quant_mlp.2": "int8_dynamic"}, r"quant_mlp.2: expected null unless depth > 2"),
    ({"quant_proj.1": "int4"}, 'quant_proj.1: expected one of fp, int8_weight_only, int8_dynamic, given "int4"'),
])
def test_a_policy_on_a_part_the_model_lacks_is_refused_naming_it(keys, named):
    with pytest.raises(ConfigError, match=f"^{named}"):
        fill({**BASE, **keys})


def test_quantizing_a_part_that_is_not_there_names_it():
    """The last guard, below the config check: quantize_model itself."""
    torch.manual_seed(0)
    model = build_model(fill({"model": "mixer_s16_224", "img_size": 32, "num_classes": 10, "epochs": 1}))
    with pytest.raises(ConfigError, match="^quant_proj: expected fp for model mixer_s16_224"):
        quantize_model(model, {"model": "mixer_s16_224", "quant_proj": "int8_dynamic"}, "cpu")
    mixed = quantize_model(model, {"model": "mixer_s16_224", "quant_mlp": "int8_dynamic"}, "cpu")
    assert len(_int8(mixed)) == 2 * 8  # the channel MLP of every block; the token-mixing MLPs stay
    vit = build_model(fill({"model": "vit_tiny_patch16_224", "img_size": 32, "num_classes": 10, "depth": 2,
                            "epochs": 1}))
    with pytest.raises(ConfigError, match=r"^quant_token_mlp: expected fp for model vit_tiny_patch16_224 \(it has "
                                          r"no the token-mixing MLP's linears"):
        quantize_model(vit, {"model": "vit_tiny_patch16_224", "quant_token_mlp": "int8_dynamic"}, "cpu")
    with pytest.raises(ConfigError, match=r"^quant_qkv.5: expected fp for model vit_tiny_patch16_224 \(.* in "
                                          r"block 5\)"):
        quantize_model(vit, {"model": "vit_tiny_patch16_224", "quant_qkv.5": "int8_dynamic"}, "cpu")


def test_the_measured_path_measures_the_model_as_deployed():
    from qkvsearch.trainers.deploy.measure import cache_key, measure, plan

    cfg = _config(embedding="fsne", quant_qkv="int8_dynamic", quant_proj="int8_dynamic", quant_mlp="int8_dynamic")
    found = measure(cfg, "cpu", metrics=("size_mb",))   # latency: tests/search/campaign/test_policy_campaign.py
    torch.manual_seed(0)
    assert found["size_mb"] == weights_bytes(quantize_model(build_model(cfg).eval(), cfg, "cpu")) / 1e6
    _, env = plan(cfg, "cpu")
    fp = {**cfg, **dict.fromkeys(QUANT_KEYS, "fp")}
    assert cache_key(cfg, env, ["size_mb"]) != cache_key(fp, env, ["size_mb"])
    assert cache_key(fp, env, ["size_mb"]) == cache_key({k: v for k, v in fp.items() if k not in QUANT_KEYS},
                                                        env, ["size_mb"])  # a model measured before policies


def test_the_precision_registry_holds_exactly_the_names_the_keys_check():
    from qkvsearch.spaces.choices import PRECISION_CHOICES
    from qkvsearch.spaces.keys import KEYS
    from qkvsearch.trainers.model.choices import PRECISIONS

    for key in QUANT_KEYS:
        assert list(PRECISIONS) == list(PRECISION_CHOICES) == list(KEYS[key].check.options)
    assert PRECISIONS["fp"].config("cpu") is None
    assert all(PRECISIONS[n].config("cpu") is not None for n in PRECISIONS if n != "fp")


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["int8_weight_only", "int8_dynamic"])
def test_each_precision_quantizes_on_cuda_and_computes_close_to_full_precision(sne_model, precision):
    """The trial's device picks torchao's settings: on CUDA every part is quantized where the model runs, and its
    logits stay close to the fp model's."""
    device = torch.device("cuda")
    cfg = _config(embedding="sne", embed_class_attn=True, **dict.fromkeys(XCIT_PARTS, precision))
    fp = copy.deepcopy(sne_model).to(device)
    model = quantize_model(copy.deepcopy(sne_model).to(device), cfg, device)
    kind = "dynamic" if precision == "int8_dynamic" else "weight_only"
    assert set(_int8(model).values()) == {kind}
    assert all(m.weight.device.type == "cuda" for m in model.modules() if isinstance(m, nn.Linear))
    x = torch.randn(8, 3, 16, 16, device=device)
    with torch.inference_mode():
        want, got = fp(x), model(x)
    assert torch.isfinite(got).all() and (got - want).abs().max() <= 0.1 * want.abs().max()
