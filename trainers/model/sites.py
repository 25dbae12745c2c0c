"""The q/k/v sites of a timm model: where its attention maps tokens to q, k and v, found by a registry of site
adapters, one per timm attention class (``ADAPTERS``).

A *site* is one attention module; its *maps* are the linears that make its q, k and v from tokens, each a
``Map``: its path under the attention, the parts it makes in its output's order (``qkv``; ``q`` and ``kv``;
``q``, ``k`` and ``v``; ``qk`` and ``v``; ``qv`` beside a manifold key), its input dim and the width of each
part, and its layout (part by part ``[q | k | v]``, or head by head ``[q1 k1 v1 | q2 k2 v2 | ...]`` as LeViT
reads it). A q/k/v embedding replaces the maps and nothing else (trainers.model.models): the attention's own
forward then runs as timm wrote it, around them (relative position bias, windows and their shifts, talking
heads, cosine attention, the spatial reduction of k/v, positional gating, q/v biases held as parameters).

An adapter says where one kind of attention keeps its maps (``Linears``), or why it has none an embedding
can take (``Refused``: the model is refused naming the site), or that the module is attention of another kind
that holds no q/k/v (``NotQKV``: kept as timm built it, like an MLP). A class is looked up along its MRO, so a
subclass takes its base's adapter unless it has its own. A module whose class name reads as attention and that
no adapter knows refuses its model by name (``unknown``): a new timm attention is one entry here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from types import MethodType, SimpleNamespace

from torch import nn

__all__ = ["ADAPTERS", "Adapter", "Linears", "Map", "NotQKV", "Refused", "Site", "Unserved", "adapter_of",
           "scan"]

PARTS = "qkv"


@dataclass(frozen=True)
class Map:
    """One linear map of an attention that makes some of its q, k, v from tokens."""

    child: str                  # its path under the attention: "qkv", "q", "kv", "qkv.linear", "qkv.qv"
    parts: str                  # the parts it makes, in its output's order: "qkv", "q", "kv", "qk", "v", "qv"
    dim: int                    # input features: the token dim it reads
    widths: tuple[int, ...]     # output features of each part
    heads: int = 0              # > 0: its output is laid out head by head over this many heads (LeViT)
    params: int = 0             # parameters of the host's own linear (weight and bias)
    bias: bool = True

    @property
    def out(self) -> int:
        return sum(self.widths)

    @property
    def equal_widths(self) -> bool:
        return len(set(self.widths)) == 1


@dataclass(frozen=True)
class Site:
    """One attention module and its q/k/v maps."""

    path: str                   # the attention module, e.g. "blocks.3.attn", "layers.1.blocks.0.attn"
    adapter: str                # its adapter's name (ADAPTERS), e.g. "fused qkv"
    maps: tuple[Map, ...]
    kind: str = "self"          # "self"; "class": q from the class token alone (embedded with embed_class_attn);
                                # "cross": q from another branch's class token (CrossViT)

    @property
    def class_attn(self) -> bool:
        return self.kind == "class"

    @property
    def dim(self) -> int:
        """The token dim d of the site (its q map's input): a hidden width given as a ratio is of it."""
        return next(m.dim for m in self.maps if "q" in m.parts)

    @property
    def parts(self) -> str:
        """The parts its maps make, in q, k, v order ("qkv"; "qv" beside a manifold key)."""
        made = "".join(m.parts for m in self.maps)
        return "".join(p for p in PARTS if p in made)

    @property
    def linear_params(self) -> int:
        return sum(m.params for m in self.maps)

    @property
    def widths(self) -> dict[str, int]:
        return {p: w for m in self.maps for p, w in zip(m.parts, m.widths)}

    @property
    def dims(self) -> dict[str, int]:
        return {p: m.dim for m in self.maps for p in m.parts}

    @property
    def shape(self) -> tuple:
        """What its embedding's counts depend on: sites of one shape share a solved ``match`` width."""
        return tuple((m.parts, m.dim, m.widths) for m in self.maps)

    def at(self, child: str) -> Map:
        return next(m for m in self.maps if m.child == child)

    def with_maps(self, maps: tuple[Map, ...]) -> Site:
        return replace(self, maps=maps)


class Unserved(Exception):
    """An attention whose q/k/v no embedding can take: ``path``, its class and why."""

    def __init__(self, path: str, cls: type, why: str):
        super().__init__(f"{path} ({cls.__name__}): {why}")
        self.path, self.cls, self.why = path, cls, why


# ---------------------------------------------------------------------------------------------- adapters


@dataclass(frozen=True)
class Adapter:
    """How one kind of attention makes q, k and v."""

    name: str

    def maps(self, attn: nn.Module) -> tuple[Map, ...]:
        """Its maps (() when it holds none: NotQKV); raises a ``str`` reason through ``why`` when it cannot be
        served."""
        return ()

    def why(self, attn: nn.Module) -> str | None:
        """Why this module's q/k/v cannot take an embedding (None: it can, or it has none)."""
        return None

    def prepare(self, attn: nn.Module) -> None:
        """Set what the attention's forward needs once its maps are embedding modules (nothing by default)."""

    kind: str = "self"


def _module(attn: nn.Module, child: str) -> nn.Module | None:
    try:
        return attn.get_submodule(child)
    except AttributeError:
        return None


def _params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _is_embedded(module: nn.Module) -> bool:
    """A module a q/k/v embedding installed at a map (trainers.model.models.apply_embedding marks it with the map it
    replaced)."""
    return hasattr(module, "qkv_map_of")


@dataclass(frozen=True)
class Linears(Adapter):
    """Maps that are ``nn.Linear`` children of the attention: ``specs`` are (child, parts) pairs; the first of
    ``alternatives`` whose children are all modules is taken (timm's fused-or-separate projections).

    widths: attention -> width of each part of each map (default: its output split evenly between its parts);
    heads: attention -> the head count of a head-by-head layout (default: part by part);
    bias_apart: the attention adds q/v biases held as parameters to the map's output, and runs its map as a
    module only when ``qkv_bias_separate`` is set (timm's BEiT, EVA, Swin V2): set it once embedded;
    key_slot: a manifold key may stand in the fused ``qkv`` (trainers.model.attention.manifold.KeyedQKV).
    """

    alternatives: tuple[tuple[tuple[str, str], ...], ...] = ()
    kind: str = "self"
    widths: object = None       # Callable[[nn.Module], tuple[tuple[int, ...], ...]] | None
    heads: object = None        # Callable[[nn.Module], int] | None
    bias_apart: bool = False
    refuse: object = None       # Callable[[nn.Module], str | None] | None: why an instance cannot be served
    then: object = None         # Callable[[nn.Module], None] | None: what else its forward needs once embedded

    def _specs(self, attn: nn.Module) -> tuple[tuple[str, str], ...]:
        for specs in self.alternatives:
            if all(isinstance(_module(attn, c), nn.Module) for c, _ in specs):
                return specs
        return self.alternatives[0]

    def why(self, attn: nn.Module) -> str | None:
        if self.refuse is not None and (reason := self.refuse(attn)):
            return reason
        for child, _ in self._specs(attn):
            m = _module(attn, child)
            if m is None:
                return f"it has no {child} to embed"
            if type(m).__name__ == "KeyedQKV" or _is_embedded(m) or isinstance(m, nn.Linear):
                continue
            return f"its {child} is a {type(m).__name__}, not a linear map"
        return None

    def maps(self, attn: nn.Module) -> tuple[Map, ...]:
        specs = self._specs(attn)
        widths = self.widths(attn) if self.widths is not None else None
        heads = self.heads(attn) if self.heads is not None else 0
        out = []
        for i, (child, parts) in enumerate(specs):
            m = attn.get_submodule(child)
            if type(m).__name__ == "KeyedQKV":     # a manifold key: q and v from the map, the key apart
                child, parts, m = f"{child}.qv", "qv", m.qv
            if _is_embedded(m):
                out.append(replace(m.qkv_map_of, child=child))
                continue
            w = widths[i] if widths is not None else (m.out_features // len(parts),) * len(parts)
            out.append(Map(child, parts, m.in_features, tuple(w), heads if len(parts) > 1 else 0, _params(m),
                           m.bias is not None))
        return tuple(out)

    def prepare(self, attn: nn.Module) -> None:
        if self.bias_apart and getattr(attn, "q_bias", None) is not None:
            attn.qkv_bias_separate = True   # timm: qkv = self.qkv(x); qkv += cat(q_bias, k_bias, v_bias)
        if self.then is not None:
            self.then(attn)


def linears(name: str, *specs: tuple[str, str], **kw) -> Linears:
    return Linears(name, alternatives=(specs,), **kw)


@dataclass(frozen=True)
class Refused(Adapter):
    """Attention from q, k and v that an embedding cannot take: the reason, for the model's refusal."""

    reason: str = ""

    def why(self, attn: nn.Module) -> str | None:
        return self.reason


@dataclass(frozen=True)
class NotQKV(Adapter):
    """A module named like attention that makes no q/k/v from tokens (a gate, an attention pool in the head, an
    outlooker): kept as timm built it. ``what`` says what it is."""

    what: str = ""


def _interleaved(attn: nn.Module) -> tuple[tuple[int, ...], ...]:
    """LeViT-style attentions: one map of per-head [q_h (key_dim) | k_h (key_dim) | v_h (val_dim)]."""
    h = attn.num_heads
    return ((attn.key_dim * h, attn.key_dim * h, attn.val_dim * h),)


def _downsample(attn: nn.Module) -> tuple[tuple[int, ...], ...]:
    """LeViT's attention downsample: q apart, then per-head [k_h | v_h]."""
    h = attn.num_heads
    return ((attn.key_dim * h,), (attn.key_dim * h, attn.val_dim * h))


def _tnt(attn: nn.Module) -> tuple[tuple[int, ...], ...]:
    """TNT: q and k of the attention's hidden dim, v of the token dim."""
    hidden = attn.qk.out_features // 2
    return ((hidden, hidden), (attn.v.out_features,))


def _heads(attn: nn.Module) -> int:
    return attn.num_heads


def _levit_conv(attn: nn.Module) -> str | None:
    return "its q/k/v map is a 1x1 convolution of the feature map with a BatchNorm (LeViT's conv mode)" \
        if getattr(attn, "use_conv", False) else None


def _gcvit_global(attn: nn.Module) -> str | None:
    return "its query is the stage's global query, made by a convolutional network, not a map of the tokens" \
        if getattr(attn, "use_global", False) else None


def _gpsa_rel_indices(self, num_patches: int):
    """timm's GPSA.get_rel_indices, with the device and dtype read off the q/k map's parameters (timm reads them off
    the linear's ``weight``, which an embedding has not)."""
    ref = next(self.qk.parameters())
    return type(self).get_rel_indices(SimpleNamespace(qk=SimpleNamespace(weight=ref)), num_patches)


def _gpsa(attn: nn.Module) -> None:
    attn.get_rel_indices = MethodType(_gpsa_rel_indices, attn)   # a bound method: a deep copy rebinds it


_FUSED = (("qkv", "qkv"),)
_QKV_APART = (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v"))
_T, _L = "timm.models.", "timm.layers."
_CONV = "its q, k and v are 1x1 convolutions of a feature map (channels first), not linear maps of tokens"

# timm attention class ("module:Class") -> its adapter
ADAPTERS: dict[str, Adapter] = {
    # one fused [q | k | v] linear
    **{cls: linears("fused qkv", *_FUSED) for cls in (
        _L + "attention:Attention", _T + "swin_transformer:WindowAttention",
        _T + "swin_transformer_v2_cr:WindowMultiHeadAttention", _T + "cait:TalkingHeadAttn", _T + "convit:MHSA",
        _T + "twins:LocallyGroupedAttn", _T + "xcit:XCA", _T + "mvitv2:MultiScaleAttention",
        _T + "hiera:MaskUnitAttention", _T + "hieradet_sam2:MultiScaleAttention", _T + "volo:Attention",
        _T + "nest:Attention", _T + "davit:WindowAttention", _T + "davit:ChannelAttention",
        _T + "davit:ChannelAttentionV2", _T + "vision_transformer_relpos:RelPosAttention",
        _T + "vision_transformer_sam:Attention", _T + "coat:FactorAttnConvRelPosEnc", _T + "fastvit:Attention",
        _T + "maxxvit:AttentionCl", _T + "metaformer:Attention", _T + "edgenext:CrossCovarianceAttn",
        _L + "diff_attention:DiffAttention")},
    # q/v biases held apart from the fused linear (timm adds them to its output)
    **{cls: linears("fused qkv, q/v biases apart", *_FUSED, bias_apart=True) for cls in (
        _T + "beit:Attention", _T + "swin_transformer_v2:WindowAttention")},
    _T + "eva:EvaAttention": Linears("fused qkv (q/v biases apart) or q, k, v apart",
                                     alternatives=(_FUSED, _QKV_APART), bias_apart=True),
    _L + "attention:AttentionRope": Linears("fused qkv or q, k, v apart", alternatives=(_FUSED, _QKV_APART)),
    _T + "gemma4_vit:Gemma4Attention": linears("q, k, v apart", ("q_proj.linear", "q"), ("k_proj.linear", "k"),
                                               ("v_proj.linear", "v")),
    _T + "gcvit:WindowAttentionGlobal": linears("fused qkv", *_FUSED, refuse=_gcvit_global),
    # maps apart
    _T + "twins:GlobalSubSampleAttn": linears("q, then k/v of the spatially reduced tokens", ("q", "q"),
                                              ("kv", "kv")),
    _T + "pvt_v2:Attention": linears("q, then k/v of the spatially reduced tokens", ("q", "q"), ("kv", "kv")),
    _T + "convit:GPSA": linears("q/k, v apart (gated positional attention)", ("qk", "qk"), ("v", "v"), then=_gpsa),
    _T + "tnt:Attention": linears("q/k, v apart", ("qk", "qk"), ("v", "v"), widths=_tnt),
    _T + "mvitv2:MultiScaleAttentionPoolFirst": linears("q, k, v apart, each of its pooled tokens", ("q", "q"),
                                                        ("k", "k"), ("v", "v")),
    _T + "nextvit:EfficientAttention": linears("q, k, v apart (k/v of the reduced tokens)", ("q", "q"),
                                               ("k", "k"), ("v", "v")),
    # class attention: q from the class token, k and v from every token
    _T + "cait:ClassAttn": linears("class attention: q, k, v apart", ("q", "q"), ("k", "k"), ("v", "v"),
                                   kind="class"),
    _T + "volo:ClassAttention": linears("class attention: k/v, q apart", ("kv", "kv"), ("q", "q"), kind="class"),
    # cross attention: q from the other branch's class token (CrossViT)
    _T + "crossvit:CrossAttention": linears("cross attention: q, k, v apart", ("wq", "q"), ("wk", "k"),
                                            ("wv", "v"), kind="cross"),
    # LeViT-style: one map laid out head by head, q/k narrower than v
    _T + "levit:Attention": linears("q/k/v head by head (q, k narrower than v)", ("qkv.linear", "qkv"),
                                    widths=_interleaved, heads=_heads, refuse=_levit_conv),
    _T + "levit:AttentionDownsample": linears("q of the subsampled tokens, k/v head by head",
                                              ("q.ln.linear", "q"), ("kv.linear", "kv"), widths=_downsample,
                                              heads=_heads, refuse=_levit_conv),
    _T + "tiny_vit:Attention": linears("q/k/v head by head (q, k narrower than v)", *_FUSED, widths=_interleaved,
                                       heads=_heads),
    _T + "efficientformer:Attention": linears("q/k/v head by head (q, k narrower than v)", *_FUSED,
                                              widths=_interleaved, heads=_heads),
    # the project's own token mixers (trainers.model.attention): fused qkv, or projections of their own
    "qkvsearch.trainers.model.attention.base:QKVAttention": linears("fused qkv", *_FUSED),
    "qkvsearch.trainers.model.attention.linformer_shared_kv:LinformerSharedKV": NotQKV(
        "shared k/v", what="keys and values are one projection: the mixer counts its own q/k/v projections"),
    "qkvsearch.trainers.model.attention.fnet:FNet": NotQKV("no q/k/v", what="Fourier mixing: no q, k or v"),
    # attention an embedding cannot take
    **{cls: Refused("fused with the MLP", reason="its q, k and v come out of one linear with the MLP's first layer "
                                                 "(in_proj)") for cls in (
        _T + "vision_transformer:ParallelScalingBlock", _T + "vision_transformer:DiffParallelScalingBlock")},
    **{cls: Refused("1x1 convolutions", reason=_CONV) for cls in (
        _T + "maxxvit:Attention2d", _T + "visformer:Attention", _L + "attention2d:Attention2d",
        _L + "attention2d:MultiQueryAttention2d", _L + "attention2d:MultiQueryAttentionV2",
        _T + "efficientformer_v2:Attention2d", _T + "efficientformer_v2:Attention2dDownsample",
        _T + "efficientvit_msra:CascadedGroupAttention", _T + "efficientvit_msra:LocalWindowAttention",
        _T + "efficientvit_mit:LiteMLA", _L + "bottleneck_attn:BottleneckAttn", _L + "halo_attn:HaloAttn",
        _L + "lambda_layer:LambdaLayer", _T + "shvit:SHSA", _T + "iformer:SHMA",
        _T + "_efficientnet_blocks:MobileAttention")},
    _T + "mobilevit:LinearSelfAttention": Refused(
        "separable self-attention", reason="separable self-attention: its query is one context score per token "
                                           "from a 1x1 convolution, not a q of the heads' width"),
    _T + "swiftformer:EfficientAdditiveAttention": Refused(
        "additive attention", reason="additive attention: a query and a key, and no value map"),
    # named like attention, but no q/k/v from tokens: kept as timm built them
    **{cls: NotQKV("attention pool", what="an attention pool in the head (not a block)") for cls in (
        _L + "attention_pool:AttentionPoolLatent", _L + "attention_pool:AttentionPoolPrr",
        _L + "attention_pool2d:AttentionPool2d", _L + "attention_pool2d:RotAttentionPool2d",
        _L + "other_pool:LsePlus2d")},
    _T + "volo:OutlookAttention": NotQKV("outlook attention", what="outlook attention: its weights are a linear "
                                                                   "map of each window's centre, no q or k"),
    **{cls: NotQKV("gating", what="a channel or spatial gate of a convolutional network") for cls in (
        _L + "coord_attn:CoordAttn", _L + "coord_attn:SimpleCoordAttn", _L + "coord_attn:EfficientLocalAttn",
        _L + "coord_attn:StripAttn", _L + "cbam:ChannelAttn", _L + "cbam:LightChannelAttn", _L + "cbam:SpatialAttn",
        _L + "cbam:LightSpatialAttn", _L + "split_attn:SplitAttn", _L + "selective_kernel:SelectiveKernelAttn",
        _L + "non_local_attn:NonLocalAttn", _L + "non_local_attn:BatNonLocalAttn",
        _L + "non_local_attn:BilinearAttnTransform", _T + "cpubone:ConvAttention", _T + "nextvit:ConvAttention",
        _T + "lowformer:ConvAttention")},
    _T + "csatv2:SpatialAttention": NotQKV("spatial gate", what="a spatial gate of a convolutional stage "
                                                                "(a one-channel attention over a 7x7 map of channel "
                                                                "statistics)"),
}

# a module whose class name reads so and that no adapter knows is taken for attention (and refused by name)
ATTENTION_NAME = re.compile(r"Attn|Attention|MHSA|SelfAttn|Attend", re.IGNORECASE)


def _key(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def adapter_of(module: nn.Module) -> Adapter | None:
    """The adapter of a module's class or its nearest registered base; None for a module no adapter knows."""
    for cls in type(module).__mro__:
        if (found := ADAPTERS.get(_key(cls))) is not None:
            return found
    return None


@dataclass
class Scan:
    """What ``scan`` found in a model: its sites, and the attentions that cannot take an embedding."""

    sites: list[Site] = field(default_factory=list)
    unserved: list[Unserved] = field(default_factory=list)
    kept: list[tuple[str, str]] = field(default_factory=list)   # (path, what) of NotQKV modules


def scan(model: nn.Module) -> Scan:
    """Every q/k/v site of ``model``, every attention it cannot serve, every NotQKV module kept."""
    out = Scan()
    inside: list[str] = []       # paths of sites found: a site's own submodules are not looked at again
    for path, m in model.named_modules():
        if any(path.startswith(p + ".") for p in inside):
            continue
        adapter = adapter_of(m)
        if adapter is None:
            if ATTENTION_NAME.search(type(m).__name__) and not _is_embedded(m) and any(
                    isinstance(c, (nn.Linear, nn.Conv2d)) for c in m.children()):
                out.unserved.append(Unserved(path, type(m), f"qkvsearch knows no q/k/v maps of timm's "
                                                            f"{type(m).__module__}.{type(m).__qualname__}"))
            continue
        if isinstance(adapter, NotQKV):
            out.kept.append((path, adapter.what))
            inside.append(path)
            continue
        why = adapter.why(m)
        if why is not None:
            out.unserved.append(Unserved(path, type(m), why))
            inside.append(path)
            continue
        out.sites.append(Site(path, adapter.name, adapter.maps(m), adapter.kind))
        inside.append(path)
    return out
