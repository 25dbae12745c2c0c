"""build_model / apply_embedding on real timm models (tiny image sizes keep them fast)."""
import pytest
import timm
import torch
from timm.models.cait import ClassAttn
from torch import nn

from qkvsearch.trainers import build_model
from qkvsearch.trainers.model.cost import model_cost
from qkvsearch.trainers.model.embeddings import FSNE, PSNE, SNE
from qkvsearch.trainers.model.models import apply_embedding

XCIT = dict(model="xcit_nano_12_p16_224", img_size=32, num_classes=10)  # 2x2 patches
VIT = dict(model="vit_tiny_patch16_224", img_size=32, num_classes=10)
VARIANTS = [
    dict(embedding="linear"),
    dict(embedding="sne"),
    dict(embedding="psne", activation="gelu"),
    dict(embedding="fsne", code_size=8),
    dict(embedding="fsne", code_size=4, code_sharing="per_block", hidden_width=0.5),
    dict(embedding="sne", embed_class_attn=True, hidden_width=16),
    dict(embedding="fsne", embed_class_attn=True, hidden_width="match"),
]


def _params(model):
    return sum(p.numel() for p in model.parameters())


def test_linear_is_timm_model_bitwise():
    torch.manual_seed(0)
    ours = build_model({**XCIT, "embedding": "linear", "lr": 1e-3})  # a training key is ignored
    torch.manual_seed(0)
    ref = timm.create_model("xcit_nano_12_p16_224", pretrained=False, img_size=32, num_classes=10)
    assert type(ours.blocks[0].attn.qkv) is nn.Linear
    ours.load_state_dict(ref.state_dict(), strict=True)
    ref.load_state_dict(ours.state_dict(), strict=True)
    x = torch.randn(2, 3, 32, 32)
    ours.eval(), ref.eval()
    with torch.no_grad():
        assert torch.equal(ours(x), ref(x))
    assert _params(ours) == _params(ref)


CASES = [(XCIT, v) for v in VARIANTS] + [(VIT, v) for v in VARIANTS[:4]]  # ViT has no class attention


@pytest.mark.parametrize("base,variant", CASES,
                         ids=lambda v: "-".join(str(x) for x in v.values()) if "embedding" in v else v["model"])
def test_forward_backward_every_variant(base, variant):
    torch.manual_seed(0)
    model = build_model({**base, **variant, "drop_path_rate": 0.1})
    out = model(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 10)
    out.logsumexp(-1).sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, missing  # every parameter (codes included) takes part
    kinds = {type(m) for m in model.modules()} & {SNE, PSNE, FSNE}
    expected = {"linear": set(), "sne": {SNE}, "psne": {PSNE}, "fsne": {FSNE}}[variant["embedding"]]
    assert kinds == expected


def test_which_blocks_are_embedded():
    model = build_model({**XCIT, "embedding": "sne"})
    assert all(isinstance(b.attn.qkv, SNE) for b in model.blocks)
    assert all(type(b.attn.q) is nn.Linear for b in model.cls_attn_blocks)  # kept by default
    model = build_model({**XCIT, "embedding": "sne", "embed_class_attn": True})
    assert all(type(b.attn) is ClassAttn and all(isinstance(getattr(b.attn, p), SNE) for p in "qkv")
               for b in model.cls_attn_blocks)   # timm's class attention, its q, k and v maps embedded
    assert model.qkv_config["width"] == 64 and model.qkv_config["hidden_width"] == "paper"


@pytest.mark.parametrize("kind", ["sne", "psne", "fsne"])
def test_class_attention_embeds_the_class_tokens_q_alone(kind):
    """timm's ClassAttn makes q of the class token only: its embedded q map sees one row per image, and shares
    what the kind shares with the k and v maps (P-SNE's second layer, F-SNE's layers)."""
    torch.manual_seed(0)
    model = build_model({**XCIT, "embedding": kind, "embed_class_attn": True})
    attn = model.cls_attn_blocks[0].attn
    seen = {}
    hooks = [getattr(attn, p).register_forward_pre_hook(lambda _m, a, p=p: seen.__setitem__(p, a[0].shape))
             for p in "qkv"]
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    for hook in hooks:
        hook.remove()
    assert seen["q"] == (2, 128) and seen["k"] == seen["v"] == (2, 5, 128)   # the class token; it and 2x2 patches
    if kind != "sne":
        assert attn.q.fc2 is attn.k.fc2 is attn.v.fc2
    cost = model_cost({**XCIT, "embedding": kind, "embed_class_attn": True})
    assert cost["params"] == _params(model)


def test_shared_codes_are_one_parameter():
    torch.manual_seed(0)
    model = build_model({**XCIT, "embedding": "fsne", "code_size": 8})
    codes = [b.attn.qkv.codes for b in model.blocks]
    assert all(c is codes[0] for c in codes)
    shared, per_block = _params(model), _params(build_model({**XCIT, "embedding": "fsne", "code_size": 8,
                                                              "code_sharing": "per_block"}))
    assert per_block - shared == 3 * 8 * 11  # 12 blocks' codes vs one set
    # one optimizer step moves every block's view of the codes, by the gradient of all blocks
    before = codes[0].detach().clone()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    model(torch.randn(2, 3, 32, 32)).square().sum().backward()
    opt.step()
    assert not torch.equal(codes[0].detach(), before)
    assert all(torch.equal(b.attn.qkv.codes, codes[0]) for b in model.blocks)
    # a state_dict round trip and a dtype change keep the sharing
    clone = build_model({**XCIT, "embedding": "fsne", "code_size": 8})
    clone.load_state_dict(model.state_dict(), strict=True)
    clone = clone.to(torch.bfloat16)
    assert all(b.attn.qkv.codes is clone.blocks[0].attn.qkv.codes for b in clone.blocks)
    torch.testing.assert_close(clone.blocks[7].attn.qkv.codes.float(), codes[0].detach(), atol=1e-2, rtol=1e-2)


def test_per_block_codes_are_independent():
    model = build_model({**XCIT, "embedding": "fsne", "code_sharing": "per_block"})
    codes = [b.attn.qkv.codes for b in model.blocks]
    assert len({id(c) for c in codes}) == 12
    with torch.no_grad():
        codes[0].zero_()
    assert codes[1].abs().sum() > 0


def test_registered_timm_names():
    model = timm.create_model("qkv_xcit_nano_12_p16_224", embedding="fsne", code_size=16, img_size=32,
                              num_classes=10)
    assert isinstance(model.blocks[3].attn.qkv, FSNE) and model.blocks[3].attn.qkv.code_size == 16
    assert "qkv_vit_tiny_patch16_224" in timm.list_models("qkv_*")
    model = build_model({"model": "qkv_deit_tiny_patch16_224", "embedding": "psne", "img_size": 32})
    assert isinstance(model.blocks[0].attn.qkv, PSNE)


def test_apply_embedding_keeps_device_and_dtype():
    with torch.device("meta"):
        model = timm.create_model("vit_tiny_patch16_224", img_size=32)
    model = apply_embedding(model, embedding="fsne", hidden_width=32)
    assert {p.device.type for p in model.parameters()} == {"meta"}
    model = timm.create_model("vit_tiny_patch16_224", img_size=32).to(torch.bfloat16)
    apply_embedding(model, embedding="sne")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


@pytest.mark.parametrize("kind,width,expected", [
    ("sne", None, 64), ("psne", None, 96), ("fsne", None, 128),  # Table 1, size S (d = 128)
    ("fsne", 0.75, 96), ("sne", 100, 100), ("linear", None, 0), ("sne", "paper", 64),
])
def test_hidden_width_resolution(kind, width, expected):
    cfg = {**XCIT, "embedding": kind, "hidden_width": width}
    assert model_cost(cfg)["width"] == expected
    assert build_model(cfg).qkv_config["width"] == expected


@pytest.mark.parametrize("kind", ["sne", "psne", "fsne"])
def test_match_is_largest_width_within_baseline(kind):
    def params(**change):  # built on the meta device: shapes only, no init cost
        with torch.device("meta"):
            return _params(build_model({**XCIT, "embedding": kind, **change}))

    h = model_cost({**XCIT, "embedding": kind, "hidden_width": "match"})["width"]
    assert params(hidden_width=h) <= params(embedding="linear") < params(hidden_width=h + 1)


@pytest.mark.parametrize("change,field,given", [
    (dict(embedding="mlp"), "embedding", '"mlp"'),
    (dict(embedding="sne", hidden_width=0), "hidden_width", "0"),
    (dict(embedding="sne", hidden_width=-0.5), "hidden_width", "-0.5"),
    (dict(embedding="sne", hidden_width="big"), "hidden_width", '"big"'),
    (dict(embedding="sne", hidden_width=True), "hidden_width", "true"),
    (dict(embedding="sne", hidden_width=0.001), "hidden_width", "0.001"),
    (dict(embedding="sne", code_size=8), "code_size", "8"),
    (dict(embedding="linear", code_size=8), "code_size", "8"),
    (dict(embedding="fsne", code_size=0), "code_size", "0"),
    (dict(embedding="fsne", code_sharing="global"), "code_sharing", '"global"'),
    (dict(embedding="fsne", activation="tanh"), "activation", '"tanh"'),
    (dict(embed_class_attn="yes"), "embed_class_attn", '"yes"'),
    (dict(drop_path_rate=1.5), "drop_path_rate", "1.5"),
    (dict(model="resnet18"), "model", '"resnet18"'),  # no fused qkv
    (dict(model="no_such_model"), "model", '"no_such_model"'),
    (dict(model=None), "model", "or an MLP-Mixer)"),  # required
    (dict(img_size=40), "img_size", "40"),  # XCiT p16 asserts; a ViT would crop silently
])
def test_bad_config_raises_value_error_naming_field(change, field, given):
    cfg = {**XCIT, **change}
    with pytest.raises(ValueError) as err:
        build_model(cfg)
    msg = str(err.value)
    assert msg.startswith(field) and msg.endswith(given), msg
    with pytest.raises(ValueError, match=field):
        model_cost(cfg)


@pytest.mark.parametrize("kind", ["sne", "psne", "fsne"])
def test_biases_are_named_as_biases_for_weight_decay(kind):
    from timm.optim import param_groups_weight_decay

    model = build_model({**XCIT, "embedding": kind})
    no_decay = {id(p) for g in param_groups_weight_decay(model, 0.05) if g["weight_decay"] == 0.0
                for p in g["params"]}
    biases = [n for n, _ in model.named_parameters() if ".qkv." in n and "bias" in n]
    assert biases and all(n.endswith(".bias") for n in biases)
    assert all(id(p) in no_decay for n, p in model.named_parameters() if n.endswith(".bias"))


def test_fsne_codes_are_not_weight_decayed_like_cls_token():
    from timm.optim import create_optimizer_v2

    from qkvsearch.trainers import build_model

    model = build_model({"model": "xcit_nano_12_p8_224", "embedding": "fsne", "img_size": 16, "num_classes": 10})
    (codes,) = [p for n, p in model.named_parameters() if n.endswith("codes")]
    opt = create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05)
    decay_of_codes = [g["weight_decay"] for g in opt.param_groups if any(p is codes for p in g["params"])]
    assert decay_of_codes == [0.0]
    assert "cls_token" in model.no_weight_decay()
    decayed = [g for g in opt.param_groups if g["weight_decay"] > 0]
    assert decayed and all(p.ndim > 1 for g in decayed for p in g["params"])


MIXER_MODEL = dict(model="mixer_s16_224", img_size=16, num_classes=10, depth=1, embed_dim=32, patch_size=4)
LINFORMER_KV = dict(VIT, img_size=16, depth=1, embed_dim=32, num_heads=2, patch_size=4,
                    attention="linformer_shared_kv", attn_proj_len=8)


@pytest.mark.parametrize("cfg,message", [
    (dict(LINFORMER_KV, embedding="sne"), 'embedding: expected linear with attention linformer_shared_kv (keys and '
                                          'values are one projection of one head: there is no q/k/v to embed), '
                                          'given "sne"'),
    (dict(LINFORMER_KV, key="manifold"), 'key: expected shared with attention linformer_shared_kv (its keys are its '
                                         'values: a key apart has no meaning), given "manifold"'),
    (dict(MIXER_MODEL, embedding="fsne"), 'embedding: expected linear with model mixer_s16_224 (an MLP-Mixer mixes '
                                          'tokens by MLPs: there is no q/k/v to embed), given "fsne"'),
    (dict(MIXER_MODEL, key="manifold"), 'key: expected shared with model mixer_s16_224 (an MLP-Mixer mixes tokens by '
                                        'MLPs: there is no key), given "manifold"'),
    (dict(MIXER_MODEL, num_heads=4), "num_heads: expected null unless the model is a ViT or DeiT or an XCiT "
                                     "(mixer_s16_224 is an MLP-Mixer: token-mixing MLPs, no attention, class token or "
                                     "positions), given 4"),
    (dict(MIXER_MODEL, pos_embed="rope1d"), 'pos_embed: expected null unless the model is a ViT or DeiT '
                                            '(mixer_s16_224 is an MLP-Mixer'),
    (dict(VIT, token_mlp_ratio=2.0), "token_mlp_ratio: expected null unless the model is an MLP-Mixer"),
    (dict(LINFORMER_KV, attn_proj_len=18), "attn_proj_len: expected at most the token count 17"),
    (dict(LINFORMER_KV, attention="softmax", attn_proj_len=None, num_heads=4, embed_dim=36, pos_embed="rope1d"),
     "pos_embed: expected an even head dim (embed_dim / num_heads) for rope1d (dims rotate in pairs), given rope1d "
     "with head dim 9"),
], ids=lambda v: v if isinstance(v, str) and len(v) < 30 else None)
def test_choices_that_cannot_work_together_are_refused_by_name(cfg, message):
    for count in (build_model, model_cost):
        with pytest.raises(ValueError) as err:
            count(cfg)
        assert str(err.value).startswith(message), str(err.value)


def test_the_mlp_mixer_is_timms_reshaped_with_the_chosen_stem():
    from timm.models.mlp_mixer import MlpMixer

    from qkvsearch.trainers.model.attention.stems import PlainConvStem

    torch.manual_seed(0)
    model = build_model(dict(MIXER_MODEL, token_mlp_ratio=2.0, mlp_ratio=0.5, patch_embed="conv_plain"))
    assert type(model) is MlpMixer and isinstance(model.stem, PlainConvStem) and len(model.blocks) == 1
    block = model.blocks[0]
    assert (block.mlp_tokens.fc1.in_features, block.mlp_tokens.fc1.out_features) == (16, 64)   # 16 patches, 2 d
    assert block.mlp_channels.fc1.out_features == 16                                          # 0.5 d
    out = model(torch.randn(2, 3, 16, 16))
    assert out.shape == (2, 10)
    out.logsumexp(-1).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    assert build_model(MIXER_MODEL).qkv_config["embedding"] == "linear"   # nothing to embed: timm's model as built
