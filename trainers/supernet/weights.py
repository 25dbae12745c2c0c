"""The supernet: one set of tensors holding the weights of every configuration of a campaign's space.

A subnet is the model ``build_model(cfg)`` defines: its module tree (a skeleton, built per model shape, the last
few kept, with its parameters on the meta device and its own buffers) runs through ``torch.func.functional_call``
on tensors cut from the supernet's (trainers.supernet.layout: its branch, the leading entries of each part of
each dim). Nothing here builds a layer: a subnet extracted (``extract``) is ``build_model(cfg)`` with weights
copied in, so its cost, measurement and every report column apply to it unchanged.

Buffers (BatchNorm running statistics, RoPE tables) stay in each skeleton: a subnet's BatchNorm statistics are
its own, recalibrated on training batches before it is scored (``recalibrate``), as Once-for-All does.
"""
from __future__ import annotations

import fnmatch
import glob
from collections import OrderedDict

import torch
from torch import nn

from qkvsearch.spaces.blocks import base_key, block_key, block_keys, is_block_key_of, split_block_key
from qkvsearch.spaces.choices import EMBEDDING_CHOICES
from qkvsearch.spaces.keys import identity, model_keys
from qkvsearch.trainers.supernet.layout import cut, fits, master_key, parts, place
from qkvsearch.trainers.supernet.layout import widest as widest_layout


def model_identity(cfg: dict) -> str:
    return identity(model_keys(cfg, "width"))


def _skeleton(cfg: dict) -> nn.Module:
    """build_model(cfg) with its parameters moved to the meta device (they are always given: functional_call)."""
    from qkvsearch.trainers.model.models import build_model

    model = build_model(cfg)
    meta: dict[int, nn.Parameter] = {}  # a tied parameter (shared codes) stays one parameter
    for module in model.modules():
        for key, param in list(module._parameters.items()):
            if param is not None:
                if id(param) not in meta:
                    meta[id(param)] = nn.Parameter(param.to("meta"), requires_grad=False)
                module._parameters[key] = meta[id(param)]
    return model


class NotServed(ValueError):
    """A configuration the supernet holds no weights for (a tensor it lacks, or one too small)."""


SKELETONS = 16   # model shapes whose module trees are kept at once: the sandwich's few, each used every few updates


class Supernet(nn.Module):
    """configs: the configurations it serves (its tensors are then, part by part, the widest layout over the
    configurations widest in some model key within each branch: ``widest``; the keys that split tensors are
    those whose value differs between them); or, with ``varying`` given, a plan's ``covers``, configurations
    whose tensors hold every configuration of its space (trainers.supernet.space), and the keys that split
    tensors. A configuration is checked when its shape is first run (``serves``). init: weights from
    ``build_model`` of the widest configurations (the widest first), so a subnet starts as a model of its own
    would; a supernet about to load trained weights skips it.

    Module trees are built per model shape when needed and kept for the SKELETONS shapes used last: scoring
    or training thousands of shapes keeps memory flat (each tree holds about a megabyte of buffers and
    modules, and takes 0.1-1 s to build: benchmarks/bench_supernet_memory.py)."""

    def __init__(self, configs: list[dict], seed: int = 0, init: bool = True, varying: frozenset | None = None):
        super().__init__()
        if varying is None:
            self.varying, covers = _varying(configs), widest(configs)
        else:
            self.varying, covers = frozenset(varying), list(configs)
        self._shapes: OrderedDict[str, tuple[nn.Module, list]] = OrderedDict()  # identity -> (skeleton, plan)
        self.layouts: dict[str, tuple] = {}                         # master key -> widest layout
        self.exempt: set[str] = set()                               # master keys without weight decay
        for cfg in covers:
            for _, key, layout in self._plan(cfg, check=False):
                self.layouts[key] = widest_layout(self.layouts[key], layout) if key in self.layouts else layout
        self.masters = nn.ParameterDict({
            _safe(key): nn.Parameter(torch.zeros([sum(p) for p in layout])) for key, layout in self.layouts.items()})
        if init:
            self._init(covers, seed)

    # -- model shapes ---------------------------------------------------------------------------------
    def _shape(self, cfg: dict, check: bool = True) -> tuple[nn.Module, list]:
        """(the subnet's module tree, its plan [(name, master key, layout)]), built when its shape was not
        among the last SKELETONS used; a shape the supernet cannot run raises NotServed (``check``)."""
        ident = model_identity(cfg)
        if ident in self._shapes:
            self._shapes.move_to_end(ident)
        else:
            skeleton = _skeleton(cfg)
            nwd = getattr(skeleton, "no_weight_decay", lambda: set())()
            plan = []
            for name, p in skeleton.named_parameters():
                key = master_key(name, cfg, self.varying)
                plan.append((name, key, parts(skeleton, name, p.shape)))
                if p.ndim <= 1 or name.endswith(".bias") or any(fnmatch.fnmatch(name, pat) for pat in nwd):
                    self.exempt.add(key)   # the stand-alone recipe's rule (timm's param_groups_weight_decay)
            self._shapes[ident] = (skeleton, plan)
            if len(self._shapes) > SKELETONS:
                self._shapes.popitem(last=False)
        skeleton, plan = self._shapes[ident]
        if check and (why := self._why_not(plan)):
            raise NotServed(f"supernet: expected a configuration of its space, given one it cannot run: {why}")
        return skeleton, plan

    def _plan(self, cfg: dict, check: bool = True) -> list[tuple[str, str, tuple]]:
        return self._shape(cfg, check)[1]

    def skeleton(self, cfg: dict) -> nn.Module:
        """The subnet's module tree, its buffers on the supernet's device."""
        skeleton = self._shape(cfg)[0]
        masters = self._modules.get("masters")
        device = next(iter(masters.values())).device if masters is not None and len(masters) else torch.device("cpu")
        for module in skeleton.modules():  # buffers only: the meta parameters stay where they are
            for key, buf in module._buffers.items():
                if buf is not None and buf.device != device:
                    module._buffers[key] = buf.to(device)
        return skeleton

    def serves(self, cfg: dict) -> str | None:
        """Why this supernet cannot run ``cfg`` (a tensor it lacks or one too small), or None."""
        return self._why_not(self._plan(cfg, check=False))

    def _why_not(self, plan) -> str | None:
        for name, key, layout in plan:
            if key not in self.layouts:
                return f"{name}: no supernet tensor for it ({key})"
            if not fits(layout, self.layouts[key]):
                return f"{name}: needs {layout}, the supernet holds {self.layouts[key]}"
        return None

    def no_weight_decay(self) -> set[str]:
        """The tensors a stand-alone model of any subnet exempts from weight decay (biases, 1-d tensors, the
        names the model lists: positions, class token), by their names here (timm's optimizer reads them)."""
        return {glob.escape(f"masters.{_safe(key)}") for key in self.exempt if key in self.layouts}

    # -- subnets --------------------------------------------------------------------------------------
    def params_for(self, cfg: dict) -> dict[str, torch.Tensor]:
        """name -> the subnet's parameter, cut from the supernet's tensors (gradients flow back to them)."""
        return {name: cut(self.masters[_safe(key)], self.layouts[key], layout)
                for name, key, layout in self._plan(cfg)}

    def forward(self, x: torch.Tensor, cfg: dict) -> torch.Tensor:
        skeleton = self.skeleton(cfg)
        skeleton.train(self.training)
        return torch.func.functional_call(skeleton, self.params_for(cfg), (x,), strict=False, tie_weights=True)

    @torch.no_grad()
    def extract(self, cfg: dict) -> dict[str, torch.Tensor]:
        """The subnet's state dict: ``build_model(cfg).load_state_dict`` takes it (tied parameters under every
        name they have, buffers as the skeleton holds them)."""
        skeleton = self.skeleton(cfg)
        params = {n: p.detach().clone() for n, p in self.params_for(cfg).items()}
        out = {}
        for name, _ in skeleton.named_parameters(remove_duplicate=False):
            owner = self._tied_name(skeleton, name)
            out[name] = params[owner]
        for name, buf in skeleton.named_buffers():
            out[name] = buf.detach().clone()
        return out

    @staticmethod
    def _tied_name(skeleton: nn.Module, name: str) -> str:
        """The name named_parameters() gives the tensor registered as ``name`` (tied ones: the first)."""
        target = skeleton.get_parameter(name)
        for first, param in skeleton.named_parameters():
            if param is target:
                return first
        return name

    @torch.no_grad()
    def recalibrate(self, cfg: dict, batches) -> None:
        """Fresh BatchNorm statistics for the subnet from ``batches`` of training images (cumulative
        averages, in train mode); a subnet without BatchNorm is left as it is."""
        skeleton = self.skeleton(cfg)
        norms = [m for m in skeleton.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        if not norms:
            return
        saved = [(m, m.momentum) for m in norms]
        for m in norms:
            m.reset_running_stats()
            m.momentum = None  # cumulative moving average over the batches
        # The skeleton is no child module of the supernet (a dict holds it): its own mode is set here, since
        # the last forward left it in eval mode, where BatchNorm would keep the statistics just reset.
        skeleton.train(True)
        params = self.params_for(cfg)
        for x in batches:
            torch.func.functional_call(skeleton, params, (x,), strict=False, tie_weights=True)
        for m, momentum in saved:
            m.momentum = momentum
        skeleton.train(self.training)

    # -- initialisation -------------------------------------------------------------------------------
    @torch.no_grad()
    def _init(self, configs: list[dict], seed: int) -> None:
        """Each tensor from the model of the widest configuration that has it; what no model covers keeps a
        small normal initialisation."""
        from qkvsearch.trainers.model.models import build_model

        for master in self.masters.values():
            if master.dim() > 1:
                nn.init.trunc_normal_(master, std=0.02)
        by_size = sorted(configs, key=lambda c: sum(sum(map(sum, lay)) for _, _, lay in self._plan(c)))
        covered: set[str] = set()
        for cfg in reversed(by_size):  # widest first: a tensor's first writer covers the most of it
            plan = [(n, k, lay) for n, k, lay in self._plan(cfg) if k not in covered]
            if not plan:
                continue
            torch.manual_seed(seed)
            model = build_model(cfg)
            values = dict(model.named_parameters())
            for name, key, layout in plan:
                place(self.masters[_safe(key)], self.layouts[key], layout, values[name])
                covered.add(key)


def varying(configs: list[dict]) -> frozenset:
    """The model keys whose value differs between ``configs``; a per-block key's variation counts as its key's."""
    keys = set().union(*(model_keys(c, "width") for c in configs))
    out = {k for k in keys if len({repr(c.get(k)) for c in configs}) > 1}
    return frozenset(base_key(k) for k in out)


_varying = varying   # Supernet.__init__ takes a parameter of that name


def widest(configs: list[dict]) -> list[dict]:
    """Per branch (the values of the categorical keys that vary), the configurations widest in each varying
    numeric model key (ties: the widest in the others): those whose tensors hold every other's; where keys are
    drawn per block, the configurations that hold every block's tensors too (``_block_covers``)."""
    from qkvsearch.spaces.supernet import BRANCH_KEYS

    varied = {k for k in set().union(*(model_keys(c, "width") for c in configs))
              if len({repr(c.get(k)) for c in configs}) > 1 and not split_block_key(k)}
    categorical = [k for k in BRANCH_KEYS if k in varied]
    numeric = [k for k in sorted(varied) if k not in categorical
               and all(c.get(k) is None or isinstance(c.get(k), (int, float)) for c in configs)]
    groups: dict[tuple, list[dict]] = {}
    for c in configs:
        groups.setdefault(tuple(repr(c.get(k)) for k in categorical), []).append(c)
    picks: dict[str, dict] = {}
    for group in groups.values():
        size = [tuple((c.get(k) or 0) for k in numeric) for c in group]
        for j in range(len(numeric)) or [0]:
            best = max(range(len(group)), key=lambda i: (size[i][j] if numeric else 0, size[i]))
            picks.setdefault(model_identity(group[best]), group[best])
    for cover in _block_covers(configs, list(picks.values())):
        picks.setdefault(model_identity(cover), cover)
    return list(picks.values())


def _block_covers(configs: list[dict], picks: list[dict]) -> list[dict]:
    """Where the embedding or its width is drawn per block: configurations (not candidates) that hold every
    block's tensors. For each pick and each embedding a block takes: every block takes that embedding at the
    widest width requested of it; for F-SNE with shared codes, also with the blocks before each block j taking
    another (the codes are the tensor of the first F-SNE block). Their width is solved (model_cost)."""
    from qkvsearch.trainers.model.cost import model_cost

    per_block = sorted({k for c in configs for k in block_keys(c)})
    if not per_block:
        return []
    kinds = sorted({v for c in configs for k, v in c.items() if is_block_key_of(k, "embedding")
                    and v is not None} | {c.get("embedding") for c in configs})
    requested = {v for c in configs for k, v in c.items() if is_block_key_of(k, "hidden_width")
                 and v is not None} | {c.get("hidden_width") for c in configs} - {None}
    depth = max(c.get("depth") or 0 for c in configs) or None
    code_size = max((c["code_size"] for c in configs if c.get("code_size")), default=None)
    sharing = next((c["code_sharing"] for c in configs if c.get("code_sharing")), None)
    out = []
    for pick in picks:   # one per branch: code sharing is the pick's where it has one
        plain = {k: v for k, v in pick.items() if not split_block_key(k)} | {"depth": depth or pick.get("depth")}
        codes = {"code_size": code_size, "code_sharing": pick.get("code_sharing") or sharing}
        for kind in kinds:
            row = EMBEDDING_CHOICES[kind]
            plain |= codes if row.codes else dict.fromkeys(codes)   # the code keys, null for an embedding without
            width = {"embedding": kind, "hidden_width": None, "width": 0}
            if row.hidden:
                solved = {w: model_cost({**plain, "embedding": kind, "hidden_width": w, "width": None})["width"]
                          for w in requested}
                hw = max(solved, key=lambda w: solved[w])
                width = {"embedding": kind, "hidden_width": hw, "width": solved[hw]}
            other = next((k for k in kinds if k != kind), kind)
            shared = row.codes and plain.get("code_sharing") == "shared"
            for first in range(plain["depth"] or 1) if shared else (0,):
                out.append({**plain, **width, **{block_key("embedding", b): other for b in range(first)}})
    return out


def _safe(key: str) -> str:
    """A master key as a ParameterDict name ('.' is not allowed in it)."""
    return key.replace(".", "/")
