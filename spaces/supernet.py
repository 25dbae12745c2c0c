"""The campaign file's ``supernet`` section: one-shot search. One weight-sharing supernet is trained over the
space; its subnets are scored with the weights they inherit (the ``search`` section's searcher proposes them,
``search.num_trials`` of them); the chosen ones then train on their own as ordinary trials, with the ``train``
section's recipe, from scratch or from the weights they inherit (search.campaign.oneshot). Every retrained
subnet is also exported as a stand-alone checkpoint that ``build_model(cfg)`` loads.

    supernet:
      train: {epochs: 30, lr: 1.0e-3}   # the supernet's recipe: train keys (the rest: the train section's)
      random_subnets: 2                 # per update, besides the largest and smallest of the update's branch
      distill: true                     # students learn the largest subnet's soft labels
      bn_batches: 2                     # training batches a subnet's BatchNorm is recalibrated on (>= 1)
      retrain: front                    # front: the inherited front; top_k: the top_k by non-dominated rank
      top_k: 4
      retrain_from: scratch             # scratch | inherited: the chosen subnets start from their inherited
                                        # weights (BatchNorm recalibrated), head included
      control: 16                       # configurations drawn from the space's feasible ones, scored and
                                        # retrained from scratch under two seeds: how well inherited
                                        # accuracy ranks, its noise floor, and a cost proxy's rank beside it
      from: results/earlier-oneshot     # search that campaign's trained supernet instead of training one
      resources: {workers_per_trial: 8} # the supernet's DDP run's own (spaces.schema.WORKER_RESOURCES); the
                                        # retrained subnets run on the resources section's

What one-shot scoring can serve: objectives and constraints on the scored subnets' figures
(spaces.metrics.SCORED_METRICS), their counted costs, and their measured costs (measured once per model shape
and policy, as a campaign of trials measures them); metrics only a training run gives (epoch times, training
loss) are refused (``check_served``). The chosen and control subnets retrain with FIFO whatever the campaign's
scheduler: every one trains its planned epochs, so the rank figures are over finished trainings.

What a supernet can share: width-like model keys (``WIDTH_KEYS``: the leading part of the largest's tensors)
and categorical ones (``BRANCH_KEYS``: weights of their own per value); both derive from the key table
(spaces.keys.Key.sliced, Key.splits); a quantization policy (``QUANT_KEYS``)
changes no weight: a subnet is scored under it, quantized after extraction (trainers.supernet.scoring). A
space that searches anything else (a training key, the model, its image or patch size) is refused naming the
key: a supernet is trained with one recipe on one input.
"""
from __future__ import annotations

from qkvsearch.spaces.blocks import base_key
from qkvsearch.spaces.checks import FLAG, POS_INT, Bad, integer
from qkvsearch.spaces.errors import Collector, show
from qkvsearch.spaces.fields import Field, choice, nonempty, read_table, section_spec, table
from qkvsearch.spaces.keys import KEYS, QUANT_KEYS, key_of, section_keys
from qkvsearch.spaces.metrics import COST_METRICS, SCORED_METRICS
from qkvsearch.spaces.schema import WORKER_RESOURCES, FrozenMap
from qkvsearch.spaces.sections import parse_worker_resources


def _splitting(tensors: str) -> tuple[str, ...]:
    """The categorical keys that split ``tensors`` (spaces.keys.Key.splits: (tensors, place)), in the order their
    values name a tensor (trainers.supernet.layout.master_key: a trained supernet's checkpoint holds those names)."""
    split = sorted((k.splits[1], k.name) for k in KEYS.values() if k.splits and k.splits[0] == tensors)
    return tuple(name for _, name in split)


# Which tensors a categorical key splits: the attention's (embedding, mixer, key), the stem's, the positions'.
ATTENTION_BRANCH = _splitting("attention")
STEM_BRANCH = _splitting("stem")
POSITION_BRANCH = _splitting("positions")
BRANCH_KEYS = (*ATTENTION_BRANCH, *STEM_BRANCH, *POSITION_BRANCH)
# (Key.sliced) the embedding's own first: the subject, and what an error names first
WIDTH_KEYS = tuple(k.name for k in sorted(KEYS.values(), key=lambda k: k.group != "embedding") if k.sliced)
RETRAIN = ("front", "top_k")
RETRAIN_FROM = ("scratch", "inherited")
_WORKERS = tuple(n for n, _ in WORKER_RESOURCES)
# The section's counts, bounded by what each can mean (spaces.checks: every int has a bound)
MAX_RANDOM_SUBNETS = 64   # each a forward and a backward of every update
MAX_BN_BATCHES = 1000     # BatchNorm statistics settle within tens of batches, and every subnet scored pays them
MAX_CONTROL = 10_000      # each scored, then retrained from scratch under two seeds
# The section's fields (spaces.fields), and its spec made of them (``train`` is its ``recipe``, ``from`` its
# ``source``); the fields that are often unset are written back only when set.
SUPERNET_FIELDS = table(
    Field("train", "a mapping of train keys (epochs, lr, ...)", FrozenMap(),
          "the supernet's recipe: train-section keys; the rest are the train section's",
          default_doc="{} (epochs required unless from)", attr="recipe", example={"epochs": 3, "lr": 1.0e-3}),
    Field("random_subnets", integer(0, MAX_RANDOM_SUBNETS), 2,
          "random subnets per update, besides the largest and smallest of the update's branch"),
    Field("distill", FLAG, True, "students learn the largest subnet's soft labels (in-place distillation)"),
    # >= 1: a subnet's BatchNorm statistics are its own; without a batch they stay at (0, 1)
    Field("bn_batches", integer(1, MAX_BN_BATCHES), 2,
          "training batches each subnet's BatchNorm is recalibrated on before scoring (past one pass over the "
          "training split: the next passes')"),
    Field("retrain", choice(*RETRAIN), "front",
          "which scored subnets train on their own: the inherited front, or the top_k by non-dominated rank"),
    Field("top_k", POS_INT, None, "how many subnets retrain, by non-dominated rank",
          default_doc="null (required with retrain: top_k)", applies=("top_k",), added_later=True),
    Field("control", integer(0, MAX_CONTROL), 16,
          "subnets drawn from the space's feasible ones, scored, and retrained from scratch under two seeds: "
          "the rank agreement's sample"),
    Field("from", nonempty("a campaign folder or URI whose supernet was trained (a string)"), None,
          "search that campaign's trained supernet instead of training one", attr="source", added_later=True),
    Field("retrain_from", choice(*RETRAIN_FROM), "scratch",
          "where the chosen subnets' training starts: from scratch, or from the weights they inherit",
          added_later=True),
    Field("resources", f"a mapping ({', '.join(_WORKERS)})", FrozenMap(),
          "the supernet's DDP run's own resources; the retrained subnets use the resources section's",
          default_doc="{} (the resources section's)", example={"workers_per_trial": 2}, added_later=True),
)
FIELDS = tuple(SUPERNET_FIELDS)


class _OneShot:
    def __bool__(self) -> bool:
        """Whether the campaign is a one-shot one: it trains a supernet, or takes one (``from``)."""
        return bool(self.recipe) or self.source is not None


SupernetSpec = section_spec("SupernetSpec", SUPERNET_FIELDS, __name__,
                            "The supernet section (SUPERNET_FIELDS): one-shot search. Empty (falsy): a campaign "
                            "that trains every configuration it proposes.", _OneShot)


def parse_supernet(raw, c: Collector) -> SupernetSpec:
    raw = c.section("supernet", raw, FIELDS, f"a mapping ({', '.join(FIELDS)})")
    if raw is None:
        return SupernetSpec()
    values = read_table(raw, SUPERNET_FIELDS, c, "supernet", **{
        "train": lambda given, c, path: _recipe(given, c, needs_epochs=raw.get("from") is None),
        "from": lambda given, c, path: (SUPERNET_FIELDS["from"].read(raw, c, "supernet") or "").rstrip("/") or None,
        "resources": lambda given, c, path: parse_worker_resources(given, path, _WORKERS, c)})
    if raw.get("retrain") == "top_k" and values["top_k"] is None:
        c.add("supernet.top_k", "required with retrain: top_k (how many subnets to retrain)")
    elif values["top_k"] is not None and values["retrain"] != "top_k":
        c.add("supernet.top_k", "applies to retrain: top_k only")
    return SupernetSpec(**values)


def _recipe(raw, c: Collector, needs_epochs: bool) -> FrozenMap:
    """supernet.train: train keys by their section names, each checked as in the train section."""
    table = section_keys("train")
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        c.expected("supernet.train", "a mapping of train keys (epochs, lr, ...)", raw)
        return FrozenMap()
    c.unknown_keys("supernet.train", raw, table)
    out = {}
    for name, value in raw.items():
        if name in table and value is not None:
            try:
                out[name] = table[name].check(value)
            except Bad as bad:
                c.expected(f"supernet.train.{name}", bad.expected or table[name].check.expected, value)
    if needs_epochs and "epochs" not in out:
        c.add("supernet.train.epochs", "required (how many epochs the supernet trains)")
    return FrozenMap(out)


def check_served(objectives, scheduler: dict | None, c: Collector) -> None:
    """A one-shot campaign's objectives are figures its scoring gives (module docstring; constraints are on costs
    already); a scheduler other than FIFO is not used (a warning: the retraining runs every subnet to its planned
    epochs)."""
    served = (*SCORED_METRICS, *COST_METRICS)
    for i, objective in enumerate(objectives):
        if objective.metric not in served:
            c.add(f"objectives[{i}].metric", f"expected a figure one-shot scoring gives ({', '.join(SCORED_METRICS)}, "
                                             f"or a cost: {', '.join(COST_METRICS)}), given {show(objective.metric)}, "
                                             "which only a training run reports")
    kind = (scheduler or {}).get("type") if isinstance(scheduler, dict) else None
    if kind not in (None, "fifo"):
        c.warn("scheduler.type", f"a one-shot campaign retrains its chosen and control subnets with FIFO, every one "
                                 f"to its planned epochs (the rank figures are over finished trainings): {kind} is "
                                 "not used")


def check_shareable(space, c: Collector) -> None:
    """A space of a one-shot campaign searches only keys a supernet can share (module docstring)."""
    shareable = set(WIDTH_KEYS) | set(BRANCH_KEYS) | set(QUANT_KEYS)
    searched = {d.key for d in space.dimensions if not d.enumerable or len({repr(v) for v in d.values}) > 1}
    for key in {k for v in space.variants for k in v}:  # a key the variants set to more than one value
        if len({repr(v.get(key)) for v in space.variants}) > 1:
            searched.add(key)
    for key in sorted(k for k in searched if base_key(k) not in shareable):
        where = "the training recipe (one for the supernet: supernet.train)" if key_of(key).group in ("train", "data") \
            else "neither a width nor a choice of layer (one supernet is one model on one input)"
        c.add(f"space.{key}", f"expected keys one supernet can share (widths: {', '.join(WIDTH_KEYS[:4])}, ...; "
                              f"choices: {', '.join(BRANCH_KEYS[:3])}, ...), given {show(key)}, which sets {where}")
