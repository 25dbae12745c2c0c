"""The configurations a supernet serves: a campaign's space over its fixed keys, each configuration resolved as a
trial's is (trainers.model.cost.resolve_trial) and at full precision (a quantization policy changes no weight).

The space is the space, not a sample of it:

    draw(rng)        one configuration drawn uniformly from the whole space (spaces.draws.RandomTrial): the
                     supernet's random students
    extreme(...)     the configuration of largest (or smallest) counted cost, within a branch and a variant if
                     asked: a search over the space's options (``_climb``), not over a sample
    summary()        the plan's facts: the branches (the values of the categorical keys drawn for the whole
                     model), each branch's largest and smallest by MACs, the teacher (the largest overall), the
                     configurations whose tensors hold every other's (``covers``) and the keys that split tensors

How the extremes are found. A configuration is one option per parameter (spaces.draws: a variant, each
enumerable dimension's values, a range's two ends: counted cost only grows with a width, so a range's extremes
lie at its ends). From several starts (every option at its largest, at its smallest, and a few drawn at
random), each parameter, and each pair of parameters one of which switches the other on (an embedding and its
width, a block's embedding and its width), is set in turn to whichever of its options improves the cost most,
until no change improves it. Counted cost is a sum over the blocks of terms each of which depends on one
block's keys and the keys of the whole model, and grows with every width: such a search ends at the true
extreme, which tests/trainers/test_supernet_space.py checks against every configuration of enumerable spaces.

Tensor sizes. A tensor's size is a product of widths (an MLP's hidden units are the token dim times the MLP
ratio, an SNE's hidden units a ratio of the token dim), each growing with its key. Within one variant and one
branch the dimensions are independent, so the configuration with the most parameters there has every tensor
at its largest: ``covers`` is that configuration for every (variant, branch), and, where blocks draw their own
embedding, the configurations that hold every block's tensors of each embedding (weights._block_covers).
"""
from __future__ import annotations

import itertools
import json

import numpy as np

from qkvsearch.spaces.blocks import block_keys, split_block_key
from qkvsearch.spaces.draws import VARIANT, PickTrial, RandomTrial, options, space_data, space_of
from qkvsearch.spaces.errors import BadInput
from qkvsearch.spaces.keys import APPLIES_WHEN, full_precision, is_policy_key
from qkvsearch.spaces.schema import Space
from qkvsearch.spaces.supernet import BRANCH_KEYS
from qkvsearch.spaces.trials import suggest_keys

RANDOM_STARTS = 2    # starts drawn at random for each extreme, beside the all-largest and all-smallest ones
MAX_DRAWS = 100      # draws before a space is taken to make no model at all
MAX_COMBOS = 4096    # joint options of the branch keys enumerated for the branches


class SubnetSpace:
    """space: the campaign's (spaces.schema.Space); base: the keys every configuration shares
    (spaces.base_config)."""

    def __init__(self, space: Space, base: dict):
        self.space, self.base = space, dict(base)
        self.options = options(space)
        self._resolved: dict[str, tuple | None] = {}

    @classmethod
    def from_data(cls, data: dict) -> SubnetSpace:
        return cls(space_of(data["space"]), data["base"])

    def to_data(self) -> dict:
        return {"space": space_data(self.space), "base": self.base}

    # -- configurations -------------------------------------------------------------------------------
    def resolve(self, keys: dict) -> tuple[dict, dict] | None:
        """(config at full precision, its counted cost) of the space keys ``keys``; None when no model can
        be made of them (e.g. a ratio that leaves no channel)."""
        text = json.dumps(keys, sort_keys=True, default=str)
        if text not in self._resolved:
            from qkvsearch.trainers.model.cost import resolve_trial

            try:
                config, cost = resolve_trial({**self.base, **keys})
                self._resolved[text] = (full_precision(config), cost)
            except BadInput:
                self._resolved[text] = None
        return self._resolved[text]

    def draw(self, rng: np.random.Generator) -> tuple[dict, dict]:
        """(space keys, config) of a configuration drawn uniformly from the whole space."""
        for _ in range(MAX_DRAWS):
            keys = suggest_keys(self.space, RandomTrial(rng))
            found = self.resolve(keys)
            if found is not None:
                return keys, found[0]
        raise BadInput("space: expected configurations a model can be made of, given none in "
                       f"{MAX_DRAWS} draws")

    def keys_of(self, picks: dict) -> dict:
        return suggest_keys(self.space, PickTrial(picks))

    # -- the extremes ---------------------------------------------------------------------------------
    def extreme(self, largest: bool, by: str = "gmacs", fixed: dict | None = None, branch: str | None = None,
                branch_keys: tuple[str, ...] = ()) -> dict | None:
        """{"keys", "config", "cost"} of the configuration of largest (else smallest) cost ``by`` (ties: the
        other of gmacs and params), its options ``fixed`` (parameter -> option index) and, with ``branch``,
        in that branch of ``branch_keys``; None when no configuration there makes a model."""
        other = "params" if by == "gmacs" else "gmacs"
        sign = 1.0 if largest else -1.0
        fixed = fixed or {}

        def score(picks: dict):
            keys = self.keys_of(picks)
            found = self.resolve(keys)
            if found is None or (branch is not None and branch_of(found[0], branch_keys) != branch):
                return None
            return (sign * found[1][by], sign * found[1][other]), keys, found

        starts = [self._start(largest)] + [self._random_start(seed) for seed in range(RANDOM_STARTS)]
        if branch is not None:
            starts += [{**self._start(largest), **combo} for combo in self._branch_combos(branch_keys, branch)]
        best = None
        for start in starts:
            found = _climb(score, {**start, **fixed}, self._groups(), self.options, frozen=set(fixed))
            if found is not None and (best is None or found[0] > best[0]):
                best = found
        if best is None:
            return None
        _, keys, (config, cost) = best
        return {"keys": keys, "config": config, "cost": cost}

    def _start(self, largest: bool) -> dict:
        """Every parameter at its largest (else smallest) option; a parameter of words at its first."""
        out = {}
        for name, opts in self.options.items():
            numbers = [o for o in opts if isinstance(o, (int, float)) and not isinstance(o, bool)]
            if name != VARIANT and len(numbers) == len(opts):
                out[name] = int(np.argmax(opts) if largest else np.argmin(opts))
            else:
                out[name] = 0
        return out

    def _random_start(self, seed: int) -> dict:
        rng = np.random.default_rng([seed, len(self.options)])
        return {name: int(rng.integers(len(opts))) for name, opts in self.options.items()}

    def _groups(self) -> list[tuple[str, ...]]:
        """Parameters moved alone, and pairs moved together: a dimension with one its condition names (not the
        depth, which decides which blocks exist, not what a block computes)."""
        names = list(self.options)
        pairs = [(on, d.key) for d in self.space.dimensions for on in d.when if on in self.options and on != "depth"]
        return [(n,) for n in names] + list(dict.fromkeys(pairs))

    # -- the plan's facts -----------------------------------------------------------------------------
    def branch_params(self) -> list[str]:
        """The parameters that decide a branch: the variant and the whole-model dimensions of branch keys."""
        return [n for n in self.options if n == VARIANT or (n in BRANCH_KEYS and not split_block_key(n))]

    def _combos(self) -> list[dict]:
        params = self.branch_params()
        sizes = [len(self.options[p]) for p in params]
        if int(np.prod(sizes, dtype=float)) > MAX_COMBOS:
            raise BadInput(f"space: expected at most {MAX_COMBOS} combinations of the keys that give a supernet "
                           f"weights of their own ({', '.join(params)}), given {int(np.prod(sizes, dtype=float))}")
        return [dict(zip(params, combo)) for combo in itertools.product(*(range(s) for s in sizes))]

    def _branch_combos(self, branch_keys: tuple[str, ...], branch: str) -> list[dict]:
        out = []
        for combo in self._combos():
            found = self._resolve_combo(combo)
            if found is not None and branch_of(found, branch_keys) == branch:
                out.append(combo)
        return out

    def _resolve_combo(self, combo: dict) -> dict | None:
        for largest in (True, False):
            found = self.resolve(self.keys_of({**self._start(largest), **combo}))
            if found is not None:
                return found[0]
        return None

    def summary(self) -> dict:
        """{"branch_keys", "branches": [[branch, largest, smallest], ...] (each an extreme()'s result, in the
        branches' order), "teacher", "smallest", "covers": [configs], "varying": [keys], "representative":
        [configs]} (module docstring)."""
        from qkvsearch.trainers.supernet.weights import _block_covers, varying

        seen = [c for c in (self._resolve_combo(combo) for combo in self._combos()) if c is not None]
        seen += self._block_variations()
        if not seen:
            raise BadInput("space: expected configurations a model can be made of, given none")
        follow = _follow_blocks(seen)
        branch_keys = tuple(k for k in BRANCH_KEYS if k not in follow and len({repr(c.get(k)) for c in seen}) > 1)
        branches = []
        for name in sorted({branch_of(c, branch_keys) for c in seen}):
            largest = self.extreme(True, branch=name, branch_keys=branch_keys)
            smallest = self.extreme(False, branch=name, branch_keys=branch_keys)
            if largest is not None:
                branches.append([name, largest, smallest])
        covers, variants = [], range(len(self.space.variants)) if self.space.variants else [None]
        for name, _, _ in branches:
            for v in variants:
                fixed = {} if v is None else {VARIANT: v}
                found = self.extreme(True, by="params", fixed=fixed, branch=name, branch_keys=branch_keys)
                if found is not None:
                    covers.append(found["config"])
        extremes = [b[1]["config"] for b in branches] + [b[2]["config"] for b in branches]
        representative = seen + extremes + covers
        covers += _block_covers(representative, covers)
        teacher = max((b[1] for b in branches), key=lambda e: (e["cost"]["gmacs"], e["cost"]["params"]))
        smallest = min((b[2] for b in branches), key=lambda e: (e["cost"]["gmacs"], e["cost"]["params"]))
        return {"branch_keys": list(branch_keys), "branches": branches, "teacher": teacher, "smallest": smallest,
                "covers": _distinct(covers), "varying": sorted(varying(representative)),
                "representative": representative}

    def _block_variations(self) -> list[dict]:
        """Every option of each per-block dimension once (the others at their largest): the values blocks
        take, for the keys that vary and the embeddings blocks hold (a block's own precision changes no weight:
        its options are the same model)."""
        out = []
        start = self._start(True)
        for name, opts in self.options.items():
            if split_block_key(name) and not is_policy_key(name):
                for i in range(len(opts)):
                    found = self.resolve(self.keys_of({**start, name: i}))
                    if found is not None:
                        out.append(found[0])
        return out


def branch_of(config: dict, branch_keys) -> str:
    """A configuration's branch: the values of the keys that give it weights of its own."""
    return json.dumps({k: config.get(k) for k in branch_keys})


def _follow_blocks(configs: list[dict]) -> set[str]:
    """Keys whose value only follows a per-block key (code sharing is set when some block is F-SNE): with
    embeddings drawn per block, a branch is the values of the keys drawn for the whole model, not 4^depth."""
    per_block = {split_block_key(k)[0] for c in configs for k in block_keys(c)}
    return {k for k, (on, _) in APPLIES_WHEN.items() if on in per_block}


def _distinct(configs: list[dict]) -> list[dict]:
    out = {json.dumps(c, sort_keys=True, default=str): c for c in configs}
    return list(out.values())


def _climb(score, start: dict, groups, opts: dict, frozen: set):
    """From ``start`` (parameter -> option), set each group of parameters in turn to its best joint options
    until no change improves ``score`` (picks -> (value, ...) or None where no model); -> the best (value,
    ...), or None when no option from this start makes a model."""
    picks = dict(start)
    best = score(picks)
    if best is None:  # a start that makes no model: the first single move that does
        for (name,) in (g for g in groups if len(g) == 1 and g[0] not in frozen):
            for i in range(len(opts[name])):
                found = score({**picks, name: i})
                if found is not None:
                    picks, best = {**picks, name: i}, found
                    break
            if best is not None:
                break
        if best is None:
            return None
    changed = True
    while changed:
        changed = False
        for group in groups:
            if any(n in frozen for n in group):
                continue
            for combo in itertools.product(*(range(len(opts[n])) for n in group)):
                if all(picks[n] == c for n, c in zip(group, combo)):
                    continue
                trial = {**picks, **dict(zip(group, combo))}
                found = score(trial)
                if found is not None and found[0] > best[0]:
                    picks, best, changed = trial, found, True
    return best
