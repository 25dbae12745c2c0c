"""The values of the choice keys, one table each: ``embedding``, ``attention``, ``pos_embed``,
``patch_embed``, ``key``, the precisions of the quantization policy's keys (``quant_qkv``, ``quant_proj``,
``quant_mlp``, ``quant_token_mlp``, and a block's own, ``quant_qkv.3``: one table for them all), and the model
families that the ``model`` name decides.

Each table maps a name to a ``Choice`` whose ``target`` names, as ``"module:Class"``, the trainers class
that builds the choice and counts its parameters and MACs. The names are strings here and are resolved by
``qkvsearch.trainers.model.choices`` on first use (Ray Tune's ``tune/search/__init__.py`` pattern): spaces is a
lower layer than trainers and imports neither it nor torch nor timm. A table is the one list of its
names: the keys' checks and docs (spaces.keys), a space's implied conditions, the size key of each
attention, the combinations refused, the classes trainers builds and the contract tests over each
registry (tests/trainers/test_choices.py) all derive from it. Adding a choice is a class in trainers and
one entry here.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_T = "qkvsearch.trainers."


@dataclass(frozen=True)
class Need:
    """A choice works only where ``key`` holds one of ``allowed``; ``why`` says why, in the error."""

    key: str
    allowed: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class Choice:
    target: str                         # "module:Class" of the trainers class (resolved lazily)
    doc: str                            # one line: what it is and where it comes from
    size_key: str | None = None         # attention: the key that sizes it (features, length, landmarks)
    needs: tuple[Need, ...] = ()        # what it cannot be combined with
    rotary: bool = False                # positions: rotate q and k inside the attention
    projects_qkv: bool = True           # attention: it projects the tokens to q, k and v (FNet does not)
    tag: str = ""                       # precision: how trial names show it (fp: nothing)
    hidden: bool = False                # embedding: a hidden layer (hidden_width sizes it; trial names show it)
    codes: bool = False                 # embedding: trainable codes (code_size, code_sharing; trial names show them)
    paper_width: float | None = None    # embedding: the paper's hidden width as a fraction of d (Table 1)


@dataclass(frozen=True)
class Family:
    """A family of timm models, told apart by the model name: what its host accepts and keeps."""

    target: str                         # "module:Class" of the trainers class that builds its timm model
    prefixes: tuple[str, ...]           # timm names of the family start so (VIT: every other name)
    label: str                          # "a ViT or DeiT", for "null unless the model is ..."
    keeps: str                          # what a model of the family keeps, for the same message
    needs: tuple[Need, ...] = ()


# An embedding is a row here and its class (trainers.model.embeddings: how it is built, counted, quantized and laid out
# in the supernet); every rule about embeddings reads their facts from the rows (``embeddings_with``).
EMBEDDING_CHOICES: dict[str, Choice] = {
    "linear": Choice(_T + "embeddings:Linear", "the model's own fused nn.Linear (XCiT, timm ViT)"),
    "sne": Choice(_T + "embeddings:SNE", "separate non-linear embedding: one 2-layer MLP each for q, k, v",
                  hidden=True, paper_width=0.5),
    "psne": Choice(_T + "embeddings:PSNE", "partially-shared: separate first layers, one shared second layer",
                   hidden=True, paper_width=0.75),
    "fsne": Choice(_T + "embeddings:FSNE", "fully-shared: one MLP for q, k, v told apart by trainable codes",
                   hidden=True, codes=True, paper_width=1.0),
}

POSITION_CHOICES: dict[str, Choice] = {
    "learned": Choice(_T + "attention.positions:Learned", "timm's learned table added to the tokens"),
    "rope": Choice(_T + "attention.positions:Rope", "2-D RoPE over the patch grid (timm RotaryEmbeddingCat, "
                                                    "as EVA), prefix tokens unrotated", rotary=True),
    "rope1d": Choice(_T + "attention.positions:Rope1d", "1-D RoPE over the flattened sequence, class token at "
                                                        "position 0, every head dim, base 10000 (Vision "
                                                        "X-formers)", rotary=True),
    "none": Choice(_T + "attention.positions:NoPositions", "no positions"),
}
UNROTATED = tuple(n for n, c in POSITION_CHOICES.items() if not c.rotary)

_NO_QKV = "there is no q/k/v to embed"
ATTENTION_CHOICES: dict[str, Choice] = {
    "softmax": Choice(_T + "attention.softmax:Softmax", "softmax(q kᵀ/√dh) v: timm's Attention"),
    "performer": Choice(_T + "attention.performer:Performer", "FAVOR+ random features (Choromanski et al.)",
                        size_key="attn_features"),
    "linformer": Choice(_T + "attention.linformer:Linformer", "keys and values projected along the tokens, "
                                                              "E and F apart (Wang et al.)",
                        size_key="attn_proj_len"),
    "linformer_shared_kv": Choice(
        _T + "attention.linformer_shared_kv:LinformerSharedKV",
        "Linformer as Vision X-formers built it: keys = values from one shared head, E = F",
        size_key="attn_proj_len",
        needs=(Need("embedding", ("linear",), f"keys and values are one projection of one head: {_NO_QKV}"),
               Need("key", ("shared",), "its keys are its values: a key apart has no meaning"))),
    "linformer_shared_kv_heads": Choice(
        _T + "attention.linformer_shared_kv:LinformerSharedKVHeads",
        "Linformer as Vision X-formers built it for RoPE: keys = values from one projection, a head per query "
        "head, E = F",
        size_key="attn_proj_len",
        needs=(Need("embedding", ("linear",), f"keys and values are one projection: {_NO_QKV}"),
               Need("key", ("shared",), "its keys are its values: a key apart has no meaning"))),
    "nystrom": Choice(_T + "attention.nystrom:Nystrom", "Nyström landmarks (Xiong et al.)",
                      size_key="attn_landmarks"),
    "fnet": Choice(_T + "attention.fnet:FNet", "Re(FFT2) over tokens and channels, no parameters (Lee-Thorp et "
                                               "al.)", projects_qkv=False,
                   needs=(Need("embedding", ("linear",), f"FNet mixes tokens by Fourier transforms: {_NO_QKV}"),
                          Need("key", ("shared",), "FNet has no key"),
                          Need("pos_embed", UNROTATED, "RoPE rotates q and k, which FNet has not"),
                          Need("quant_qkv", ("fp",), "FNet has no q/k/v projection to quantize"),
                          Need("quant_proj", ("fp",), "FNet has no output projection to quantize"))),
}

STEM_CHOICES: dict[str, Choice] = {
    "linear": Choice(_T + "attention.stems:LinearStem", "timm's PatchEmbed: one p x p stride-p convolution"),
    "conv": Choice(_T + "attention.stems:ConvStem", "conv3x3-BN-ReLU twice, then the projection to d"),
    "conv_plain": Choice(_T + "attention.stems:PlainConvStem", "three plain biased 3x3 convs 3-32-64-d, "
                                                               "nothing between them (Vision X-formers)"),
}

KEY_CHOICES: dict[str, Choice] = {
    "shared": Choice(_T + "attention.manifold:SharedKey", "the key comes from the q/k/v embedding"),
    "manifold": Choice(_T + "attention.manifold:ManifoldKey", "charts apart from q and v (arXiv 2402.00534)",
                       needs=(Need("quant_qkv", ("fp",), "the manifold key's charts compute with batched matmuls, "
                                                         "which int8 quantization of linears does not reach"),)),
}

# The precision of a part of the network under a quantization policy (trainers.model.quantize): applied after training,
# the part's in every block but those given their own (quant_qkv.3: spaces.blocks); the patch embedding and the
# head stay in the model's own precision.
PRECISION_CHOICES: dict[str, Choice] = {
    "fp": Choice(_T + "quantize:FullPrecision", "the model's own precision (fp32; bf16 autocast on CUDA)"),
    "int8_weight_only": Choice(_T + "quantize:Int8WeightOnly", "int8 weights, one scale per output channel; "
                                                               "activations and matmuls in floating point",
                               tag="w8"),
    "int8_dynamic": Choice(_T + "quantize:Int8Dynamic", "int8 weights per output channel and int8 activations "
                                                        "per token, scaled at run time; int8 matmuls", tag="a8w8"),
}
FULL_PRECISION = "fp"
# The parts a policy sets, each by its key: what each holds, in every block (class-attention blocks included).
QUANT_PARTS: dict[str, str] = {
    "quant_qkv": "the q/k/v embedding's linears (timm's fused qkv, SNE / P-SNE / F-SNE layers, class attention's "
                 "q, k, v)",
    "quant_proj": "the attention's output projection",
    "quant_mlp": "the MLP's linears (an MLP-Mixer's channel MLP)",
    "quant_token_mlp": "the token-mixing MLP's linears (an MLP-Mixer's)",
}

VIT, XCIT, MIXER, TIMM = "vit", "xcit", "mixer", "timm"
_MIXER_WHY = "an MLP-Mixer mixes tokens by MLPs"
_NO_TOKEN_MLP = Need("quant_token_mlp", ("fp",), "only an MLP-Mixer has token-mixing MLPs to quantize")
FAMILIES: dict[str, Family] = {
    VIT: Family(_T + "hosts:ViT", (), "a ViT or DeiT", "is a ViT, a DeiT or another timm transformer",
                needs=(_NO_TOKEN_MLP,)),
    XCIT: Family(_T + "hosts:XCiT", ("xcit",), "an XCiT",
                 "keeps its cross-covariance attention, conv stem and Fourier positions", needs=(_NO_TOKEN_MLP,)),
    MIXER: Family(_T + "hosts:Mixer", ("mixer_",), "an MLP-Mixer",
                  "is an MLP-Mixer: token-mixing MLPs, no attention, class token or positions",
                  needs=(Need("embedding", ("linear",), f"{_MIXER_WHY}: {_NO_QKV}"),
                         Need("key", ("shared",), f"{_MIXER_WHY}: there is no key"),
                         Need("quant_qkv", ("fp",), f"{_MIXER_WHY}: there is no q/k/v to quantize"),
                         Need("quant_proj", ("fp",), f"{_MIXER_WHY}: there is no attention projection to quantize"))),
    # any other timm transformer (Swin, CaiT, BEiT, EVA, ...): no name tells it from a ViT here, so model_family
    # names it vit and trainers.model.choices.family_name tells it by timm's module; its host refuses by name what
    # it cannot take (trainers.model.hosts.Timm)
    TIMM: Family(_T + "hosts:Timm", (), "another timm transformer", "is a timm transformer other than ViT/DeiT, "
                                                                    "XCiT and MLP-Mixer", needs=(_NO_TOKEN_MLP,)),
}

# key -> its table (the model family is decided by the model name: model_family)
TABLES: dict[str, Mapping[str, Choice]] = {
    "embedding": EMBEDDING_CHOICES, "attention": ATTENTION_CHOICES, "pos_embed": POSITION_CHOICES,
    "patch_embed": STEM_CHOICES, "key": KEY_CHOICES,
}


def model_family(model: Any, registered_prefix: str) -> str:
    """The family of a timm model name (``<registered_prefix><name>``, our registered variant, as ``<name>``)."""
    if not isinstance(model, str):
        return VIT
    name = model.removeprefix(registered_prefix)
    return next((f for f, fam in FAMILIES.items() if fam.prefixes and name.startswith(fam.prefixes)), VIT)


def embeddings_with(fact: str) -> tuple[str, ...]:
    """The embeddings whose row has ``fact`` ("hidden", "codes"): those the keys of that fact apply to."""
    return tuple(n for n, c in EMBEDDING_CHOICES.items() if getattr(c, fact))


def sized_by(key: str) -> tuple[str, ...]:
    """The attentions that ``key`` sizes (attn_proj_len: both Linformers)."""
    return tuple(n for n, c in ATTENTION_CHOICES.items() if c.size_key == key)


def unmet_need(cfg: Mapping, family: str) -> tuple[str, str, Any] | None:
    """(key, expected, given) of the first value a chosen attention or key, or the model's ``family``, cannot work
    with."""
    owners = [(f"model {cfg.get('model')}", FAMILIES[family].needs)]
    attention = ATTENTION_CHOICES.get(cfg.get("attention"))
    if attention is not None:
        owners.append((f"attention {cfg['attention']}", attention.needs))
    key = KEY_CHOICES.get(cfg.get("key"))
    if key is not None:
        owners.append((f"key {cfg['key']}", key.needs))
    for owner, needs in owners:
        for need in needs:
            given = cfg.get(need.key)
            if given is not None and given not in need.allowed:
                return need.key, f"{' or '.join(need.allowed)} with {owner} ({need.why})", given
    return None


def policy_text(policy: Mapping[str, str]) -> str:
    """A quantization policy (spaces.keys.quant_policy: quant key -> precision, parts in full precision left
    out) as people read it: ``qkv int8_dynamic, mlp int8_weight_only``, or ``fp`` when it quantizes nothing."""
    return ", ".join(f"{k.removeprefix('quant_')} {v}" for k, v in policy.items()) or FULL_PRECISION
