"""Query/key/value embeddings that replace the q/k/v maps of a transformer's attention (trainers.model.sites):
a fused ``qkv = nn.Linear(d, 3 * d_out)``, or maps apart (``q`` and ``kv``, ``q``, ``k`` and ``v``, ...).

Every module maps tokens ``x`` of shape (..., d) to (..., parts * d_out), laid out like the linear it replaces:
``[q | k | v]`` along the last dim, so timm's attention reshapes it unchanged.

=========  =============================================  ==========================================
kind       Q (K, V alike)                                 shared between Q, K, V
=========  =============================================  ==========================================
linear     ``X Wq``                                       nothing (timm's own ``nn.Linear``)
sne        ``σ(X Wq1) Wq2``, Wq1: d×h, Wq2: h×d_out        nothing
psne       ``σ(X Wq1) Ws2``                               second layer Ws2 (h×d_out)
fsne       ``σ((X ⊕ Cq) Ws1) Ws2``, Ws1: (d+n)×h           both layers; codes Cq, Ck, Cv ∈ R^(1×n)
=========  =============================================  ==========================================

Each kind is one class (the registry ``trainers.model.choices.EMBEDDINGS``; its facts on its row, spaces.choices) that
builds itself (``build``), counts one module's parameters (without codes: shared codes count once, per-block
codes per module) and its MACs over N tokens at batch 1, as the module computes them (F-SNE in its factored
form), gives its form of plain linears for quantization (``linear_form``: trainers.model.embedding_forms) and the
parts its parameters hold end to end for the supernet's slicing (``tensor_parts``).
``parts``: 3 embeds ``[q | k | v]``; 2 embeds ``[q | v]`` (the key is computed apart, see
trainers.model.attention.manifold), or the two parts of a map that makes two (``kv``, ``qk``).

A site (one attention) is embedded by ``build_site``: one module per map of the site, sharing what the kind shares
between q, k and v (P-SNE's second layer, F-SNE's layers and codes) across the site's maps, so an attention that
makes q apart from k and v (Twins, PVT, CaiT's class attention, CrossViT) holds the same embedding as a fused one;
``site_params`` and ``site_macs`` count it (MACs over each map's rows: tokens as the map sees them, all windows at
batch 1). Where a kind cannot apply to a site (P-SNE and F-SNE share layers between q, k and v, so they need one
width for all three; F-SNE also one input dim), ``refuse`` says why.

Every layer has a bias. Weights are initialised like timm's ViT/XCiT linears (truncated normal,
std 0.02, zero bias); codes start from N(0, 1) so that Q, K and V differ from the first step
(codes of std 0.02 would make the three nearly identical and break the symmetry slowly).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import trunc_normal_
from torch import nn

from qkvsearch.spaces.keys import ACTIVATIONS, KEYS

DEFAULT_ACTIVATION = KEYS["activation"].default
DEFAULT_CODE_SIZE = KEYS["code_size"].default
INIT_STD = 0.02  # timm's std for transformer linears


def make_activation(name: str) -> nn.Module:
    """``relu`` (in place: it follows a fresh matmul output, whose backward does not need it) or ``gelu``."""
    if name == "relu":
        return nn.ReLU(inplace=True)
    if name == "gelu":
        return nn.GELU()
    raise ValueError(f"activation: expected one of {ACTIVATIONS}, given {name!r}")


def _init_linear(layer: nn.Linear) -> None:
    trunc_normal_(layer.weight, std=INIT_STD)
    nn.init.zeros_(layer.bias)


def _groups(widths: tuple[int, ...]) -> list[tuple[int, int]]:
    """A map's part widths as runs of equal width, in order: (width, parts) each ((256, 2), (512, 1) for q/k
    narrower than v)."""
    runs: list[list[int]] = []
    for w in widths:
        if runs and runs[-1][0] == w:
            runs[-1][1] += 1
        else:
            runs.append([w, 1])
    return [(w, n) for w, n in runs]


def _listing(values: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in values.items())


class MapOut(nn.Module):
    """A map's output from several embedding modules (one per run of equal part widths), joined part by part
    ``[q | k | v]`` and, for an attention that reads its map head by head (LeViT: ``[q1 k1 v1 | q2 k2 v2 | ...]``),
    laid out so. No parameters; reshapes only."""

    def __init__(self, embeds: list[nn.Module], widths: tuple[int, ...], heads: int = 0):
        super().__init__()
        self.embeds = nn.ModuleList(embeds)
        self.widths, self.heads = tuple(widths), heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.cat([e(x) for e in self.embeds], dim=-1) if len(self.embeds) > 1 else self.embeds[0](x)
        if self.heads:   # (..., [q | k | v]) -> (..., heads, [q_h | k_h | v_h]) -> (..., heads · (...))
            parts = y.split(self.widths, dim=-1)
            y = torch.cat([p.unflatten(-1, (self.heads, -1)) for p in parts], dim=-1).flatten(-2)
        return y

    def extra_repr(self) -> str:
        return f"widths={self.widths}, heads={self.heads}"


def _joined(modules: list[nn.Module], widths: tuple[int, ...], heads: int) -> nn.Module:
    return modules[0] if len(modules) == 1 and not heads else MapOut(modules, widths, heads)


class SiteEmbedding:
    """What every kind answers for a site (trainers.model.sites.Site): one module per map (``build_site``), its
    parameters and MACs (``site_params``, ``site_macs``: rows[child] = (rows, calls) of each map, as the host's map
    saw them at batch 1), and why it cannot apply (``refuse``). By default each map is built and counted as modules
    of its own, one per run of equal part widths (SNE: nothing is shared), from the class's one-module ``build``,
    ``params`` and ``macs``. Its form for quantization: ``linear_form``."""

    def linear_form(self, shared: dict | None = None) -> nn.Module:
        """Its form of plain linears (trainers.model.embedding_forms); ``shared``: what the forms made so far for
        the other maps of its site hold, for a module they share (by id). An embedding of linears alone is its
        own."""
        return self

    @classmethod
    def refuse(cls, site) -> str | None:
        return None

    @classmethod
    def build_site(cls, site, hidden, activation=DEFAULT_ACTIVATION, code_size=0, codes=None, letters="qkv"):
        return {m.child: _joined([cls.build(m.dim, hidden, w, activation, code_size, None, n)
                                  for w, n in _groups(m.widths)], m.widths, m.heads) for m in site.maps}

    @classmethod
    def site_params(cls, site, hidden, code_size=0) -> int:
        return sum(cls.params(m.dim, hidden, w, code_size, n) for m in site.maps for w, n in _groups(m.widths))

    @classmethod
    def site_macs(cls, site, hidden, code_size, rows: dict) -> int:
        return sum(cls.macs(m.dim, hidden, rows[m.child][0], w, code_size, n) for m in site.maps
                   for w, n in _groups(m.widths))


class GroupedLinear(nn.Module):
    """``groups`` independent linears (in -> out) applied to (groups, M, in) with one batched matmul.

    ``weight`` is (groups, in, out), ``bias`` (groups, out); the names end like nn.Linear's, so optimizers
    that skip ``*.bias`` for weight decay treat it like any bias.
    """

    def __init__(self, groups: int, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(groups, in_features, out_features))
        self.bias = nn.Parameter(torch.zeros(groups, out_features))
        trunc_normal_(self.weight, std=INIT_STD)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.bias.unsqueeze(1), x, self.weight)  # (g, M, in) @ (g, in, out) + (g, 1, out)


class SNE(nn.Module, SiteEmbedding):
    """Separate non-linear embedding: one 2-layer MLP each for Q, K and V.

    The three first layers are stored stacked as one ``Linear(d, 3h)`` (rows ``[Wq1; Wk1; Wv1]``, three
    biases of h), so they run as a single matmul; the three second layers are one GroupedLinear
    (weight (3, h, d_out), bias (3, d_out)), one batched matmul. Parameters: 3·(d·h + h + h·d_out + d_out).
    """

    def __init__(self, dim: int, hidden: int, dim_out: int | None = None, activation: str = DEFAULT_ACTIVATION,
                 parts: int = 3):
        super().__init__()
        dim_out = dim if dim_out is None else dim_out
        self.dim, self.hidden, self.dim_out, self.parts = dim, hidden, dim_out, parts
        self.fc1 = nn.Linear(dim, parts * hidden)  # [Wq1; Wk1; Wv1]
        self.act = make_activation(activation)
        self.fc2 = GroupedLinear(parts, hidden, dim_out)  # Wq2, Wk2, Wv2
        _init_linear(self.fc1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]                                                    # (B, N), or any leading dims
        hid = self.act(self.fc1(x)).view(-1, self.parts, self.hidden)  # (BN, 3, h)
        out = self.fc2(hid.transpose(0, 1))  # (3, BN, d_out)
        return out.transpose(0, 1).reshape(*lead, self.parts * self.dim_out)  # (B, N, [q | k | v])

    def extra_repr(self) -> str:
        return f"dim={self.dim}, hidden={self.hidden}, dim_out={self.dim_out}"

    @classmethod
    def build(cls, dim, hidden, dim_out=None, activation=DEFAULT_ACTIVATION, code_size=0, codes=None, parts=3):
        return cls(dim, hidden, dim_out, activation, parts)

    def linear_form(self, shared: dict | None = None) -> nn.Module:
        """Its form of plain linears for quantization: the grouped second layer as one Linear per part."""
        from qkvsearch.trainers.model.embedding_forms import SNELinears

        return SNELinears(self)

    def tensor_parts(self, child: str, leaf: str, shape) -> dict[int, tuple[int, ...]]:
        """dim -> the sizes of the parts lying end to end along it in parameter ``child.leaf`` (the supernet's
        slicing, trainers.supernet.layout): fc1's rows [Wq1; Wk1; Wv1], (G h, d) and (G h,)."""
        return {0: (shape[0] // self.parts,) * self.parts} if child == "fc1" else {}

    @classmethod
    def params(cls, dim, hidden, dim_out=None, code_size=0, parts=3) -> int:
        o = dim if dim_out is None else dim_out
        return parts * (dim * hidden + hidden + hidden * o + o)

    @classmethod
    def macs(cls, dim, hidden, tokens, dim_out=None, code_size=0, parts=3) -> int:
        o = dim if dim_out is None else dim_out
        return tokens * (parts * dim * hidden + parts * hidden * o)


class PSNE(nn.Module, SiteEmbedding):
    """Partially-shared non-linear embedding: separate first layers, one shared second layer Ws2.

    Parameter count: 3·(d·h + h) + h·d_out + d_out.
    """

    def __init__(self, dim: int, hidden: int, dim_out: int | None = None, activation: str = DEFAULT_ACTIVATION,
                 parts: int = 3):
        super().__init__()
        dim_out = dim if dim_out is None else dim_out
        self.dim, self.hidden, self.dim_out, self.parts = dim, hidden, dim_out, parts
        self.fc1 = nn.Linear(dim, parts * hidden)  # [Wq1; Wk1; Wv1]
        self.act = make_activation(activation)
        self.fc2 = nn.Linear(hidden, dim_out)  # Ws2
        _init_linear(self.fc1)
        _init_linear(self.fc2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]                                                    # (B, N), or any leading dims
        hid = self.act(self.fc1(x)).view(*lead, self.parts, self.hidden)  # (B, N, 3, h)
        return self.fc2(hid).view(*lead, self.parts * self.dim_out)  # one matmul for Q, K, V -> (B, N, 3 d_out)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, hidden={self.hidden}, dim_out={self.dim_out}"

    @classmethod
    def build(cls, dim, hidden, dim_out=None, activation=DEFAULT_ACTIVATION, code_size=0, codes=None, parts=3):
        return cls(dim, hidden, dim_out, activation, parts)

    macs = classmethod(SNE.macs.__func__)   # SNE's products: one shared second-layer weight, the same matmuls
    tensor_parts = SNE.tensor_parts          # fc1 as SNE's

    def linear_form(self, shared: dict | None = None) -> nn.Module:
        return self   # linears alone

    @classmethod
    def params(cls, dim, hidden, dim_out=None, code_size=0, parts=3) -> int:
        o = dim if dim_out is None else dim_out
        return parts * (dim * hidden + hidden) + hidden * o + o

    @classmethod
    def refuse(cls, site) -> str | None:
        if len(set(site.widths.values())) > 1:
            return ("psne shares one second layer between q, k and v, so they need one width "
                    f"(here {_listing(site.widths)})")
        return None

    @classmethod
    def build_site(cls, site, hidden, activation=DEFAULT_ACTIVATION, code_size=0, codes=None, letters="qkv"):
        """One module per map, all with the site's one second layer Ws2."""
        out, fc2 = {}, None
        for m in site.maps:
            module = cls(m.dim, hidden, m.widths[0], activation, len(m.parts))
            if fc2 is None:
                fc2 = module.fc2
            else:
                module.fc2 = fc2
            out[m.child] = _joined([module], m.widths, m.heads)
        return out

    @classmethod
    def site_params(cls, site, hidden, code_size=0) -> int:
        o = site.maps[0].widths[0]
        return sum(len(m.parts) * (m.dim * hidden + hidden) for m in site.maps) + hidden * o + o

    @classmethod
    def site_macs(cls, site, hidden, code_size, rows: dict) -> int:
        return sum(cls.macs(m.dim, hidden, rows[m.child][0], m.widths[0], code_size, len(m.parts)) for m in site.maps)


def make_codes(code_size: int, parts: int = 3) -> nn.Parameter:
    """Trainable codes (Cq, Ck, Cv) as one (3, n) Parameter, N(0, 1) initialised ((2, n): Cq, Cv)."""
    if code_size < 1:
        raise ValueError(f"code_size: expected an integer >= 1, given {code_size!r}")
    return nn.Parameter(torch.randn(parts, code_size))


class FSNE(nn.Module, SiteEmbedding):
    """Fully-shared non-linear embedding: ``σ((X ⊕ C) Ws1) Ws2`` for C in (Cq, Ck, Cv).

    ``fc1.weight`` is Ws1ᵀ, (h, d + n): columns [:d] act on tokens, [d:] on codes. The forward uses the
    factored form ``(X ⊕ C) Ws1 = X·Ws1[:d] + C·Ws1[d:]``: the token part is one matmul shared by Q, K
    and V, the code part three (1, n)@(n, h) products broadcast over tokens; then one matmul with Ws2
    for all of Q, K, V. Pass ``codes`` to share one Parameter between modules (network-wide codes).
    Parameter count: (d + n)·h + h + h·d_out + d_out, plus 3·n for codes the module owns.
    """

    def __init__(
        self,
        dim: int,
        hidden: int,
        code_size: int = DEFAULT_CODE_SIZE,
        dim_out: int | None = None,
        activation: str = DEFAULT_ACTIVATION,
        codes: nn.Parameter | None = None,
        parts: int = 3,
        rows: tuple[int, ...] | None = None,
    ):
        super().__init__()
        dim_out = dim if dim_out is None else dim_out
        self.dim, self.hidden, self.dim_out, self.parts = dim, hidden, dim_out, parts
        self.codes = make_codes(code_size, parts) if codes is None else codes  # (3, n): Cq, Ck, Cv
        self.rows = rows   # the codes of the parts it makes, where it makes some of them (a map apart: q, or k/v)
        if self.codes.shape[1:] != (code_size,) or len(self.codes) != parts and (rows is None or len(rows) != parts):
            raise ValueError(f"codes must have shape ({parts}, {code_size}), given {tuple(self.codes.shape)}")
        self.code_size = code_size
        self.fc1 = nn.Linear(dim + code_size, hidden)  # Ws1ᵀ
        self.act = make_activation(activation)
        self.fc2 = nn.Linear(hidden, dim_out)  # Ws2ᵀ
        _init_linear(self.fc1)
        _init_linear(self.fc2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]                                                    # (B, N), or any leading dims
        w_x, w_c = self.fc1.weight[:, : self.dim], self.fc1.weight[:, self.dim :]  # (h, d), (h, n)
        hx = F.linear(x, w_x, self.fc1.bias)  # (B, N, h), once for Q, K and V
        codes = self.codes if self.rows is None else self.codes[list(self.rows)]
        hc = F.linear(codes, w_c)  # (3, h): Cq, Ck, Cv projected
        hid = self.act(hx.unsqueeze(-2) + hc)  # (B, N, 3, h)
        return self.fc2(hid).view(*lead, self.parts * self.dim_out)  # (B, N, [q | k | v])

    def forward_literal(self, x: torch.Tensor) -> torch.Tensor:
        """Reference form: concatenate each code to every token, then run the MLP (3x the first matmul)."""
        B, N, _ = x.shape
        outs = []
        for code in (self.codes if self.rows is None else self.codes[list(self.rows)]):  # (n,)
            xc = torch.cat([x, code.expand(B, N, self.code_size)], dim=-1)  # (B, N, d + n)
            outs.append(self.fc2(self.act(self.fc1(xc))))
        return torch.cat(outs, dim=-1)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, hidden={self.hidden}, code_size={self.code_size}, dim_out={self.dim_out}"



    @classmethod
    def build(cls, dim, hidden, dim_out=None, activation=DEFAULT_ACTIVATION, code_size=DEFAULT_CODE_SIZE,
              codes=None, parts=3):
        return cls(dim, hidden, code_size, dim_out, activation, codes, parts)

    @classmethod
    def refuse(cls, site) -> str | None:
        if len(set(site.widths.values())) > 1:
            return f"fsne shares its layers between q, k and v, so they need one width (here {_listing(site.widths)})"
        if len(set(site.dims.values())) > 1:
            return f"fsne shares its first layer between q, k and v, so they need one input dim (here " \
                   f"{_listing(site.dims)})"
        return None

    @classmethod
    def build_site(cls, site, hidden, activation=DEFAULT_ACTIVATION, code_size=DEFAULT_CODE_SIZE, codes=None,
                   letters="qkv"):
        """One module per map, all with the site's one pair of layers and each with the codes of its own parts
        (``codes``: (len(letters), n), the network's or the site's)."""
        out, first = {}, None
        for m in site.maps:
            rows = tuple(letters.index(p) for p in m.parts)
            module = cls(m.dim, hidden, code_size, m.widths[0], activation, codes, len(m.parts),
                         None if rows == tuple(range(len(letters))) else rows)
            if first is None:
                first = module
            else:
                module.fc1, module.fc2 = first.fc1, first.fc2
            out[m.child] = _joined([module], m.widths, m.heads)
        return out

    @classmethod
    def site_params(cls, site, hidden, code_size=0) -> int:
        return cls.params(site.dim, hidden, site.maps[0].widths[0], code_size)

    @classmethod
    def site_macs(cls, site, hidden, code_size, rows: dict) -> int:
        """Per map: its rows' token part, the codes of its parts once a call, its rows' second layer."""
        o = site.maps[0].widths[0]
        return sum(rows[m.child][0] * m.dim * hidden + rows[m.child][1] * len(m.parts) * code_size * hidden
                   + rows[m.child][0] * len(m.parts) * hidden * o for m in site.maps)

    def linear_form(self, shared: dict | None = None) -> nn.Module:
        """Its form of plain linears for quantization: the first layer's token part a Linear, its code part a
        constant (``shared``: the token parts already made for the other maps of its site)."""
        from qkvsearch.trainers.model.embedding_forms import FSNELinears

        return FSNELinears(self, shared)

    def tensor_parts(self, child: str, leaf: str, shape) -> dict[int, tuple[int, ...]]:
        """fc1's weight (h, d + n): the tokens' columns, then the codes'."""
        return {1: (shape[1] - self.code_size, self.code_size)} if (child, leaf) == ("fc1", "weight") else {}

    @classmethod
    def params(cls, dim, hidden, dim_out=None, code_size=0, parts=3) -> int:
        """Without the codes (network-wide codes count once: trainers.model.models.codes_params)."""
        o = dim if dim_out is None else dim_out
        return (dim + code_size) * hidden + hidden + hidden * o + o

    @classmethod
    def macs(cls, dim, hidden, tokens, dim_out=None, code_size=0, parts=3) -> int:
        """Factored form: N·d·h (tokens, once) + 3·n·h (codes) + 3·N·h·d_out."""
        o = dim if dim_out is None else dim_out
        return tokens * dim * hidden + parts * code_size * hidden + tokens * parts * hidden * o


class Linear(nn.Linear, SiteEmbedding):
    """``linear``: the model's own fused projection (d -> parts·d_out with bias), which stays timm's
    ``nn.Linear`` in a model; this class only builds and counts one like it."""

    def linear_form(self, shared: dict | None = None) -> nn.Module:
        return self

    def tensor_parts(self, child: str, leaf: str, shape) -> dict[int, tuple[int, ...]]:
        return {}

    @classmethod
    def build(cls, dim, hidden=0, dim_out=None, activation=DEFAULT_ACTIVATION, code_size=0, codes=None, parts=3):
        return cls(dim, parts * (dim if dim_out is None else dim_out))

    @classmethod
    def params(cls, dim, hidden=0, dim_out=None, code_size=0, parts=3) -> int:
        o = dim if dim_out is None else dim_out
        return dim * parts * o + parts * o

    @classmethod
    def macs(cls, dim, hidden, tokens, dim_out=None, code_size=0, parts=3) -> int:
        o = dim if dim_out is None else dim_out
        return tokens * dim * parts * o

    @classmethod
    def build_site(cls, site, hidden=0, activation=DEFAULT_ACTIVATION, code_size=0, codes=None, letters="qkv"):
        return {}   # the host's own maps stay

    @classmethod
    def site_params(cls, site, hidden=0, code_size=0) -> int:
        return site.linear_params

    @classmethod
    def site_macs(cls, site, hidden, code_size, rows: dict) -> int:
        return sum(rows[m.child][0] * m.dim * m.out for m in site.maps)
