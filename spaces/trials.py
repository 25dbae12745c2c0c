"""From a CampaignSpec to flat trial configs (the dicts trainers.build_model / model_cost / the loop take)."""
from __future__ import annotations

from qkvsearch.spaces import dimensions
from qkvsearch.spaces.draws import RandomTrial
from qkvsearch.spaces.errors import SpecError
from qkvsearch.spaces.keys import flatten
from qkvsearch.spaces.schema import FrozenMap, tagged
from qkvsearch.spaces.spec import CampaignSpec
from qkvsearch.spaces.stages import smoke_stages


def base_config(spec: CampaignSpec) -> dict:
    """The flat config every trial shares: the model, data and train sections by trial key
    (model.name -> "model", data.path -> "data_path"). A trial's space values override these."""
    return {**flatten("model", spec.model.as_dict()), **flatten("data", spec.data.as_dict()),
            **flatten("train", spec.train.as_dict())}


def expand_space(spec: CampaignSpec) -> list[dict]:
    """Every flat trial config of a grid-only space (all dimensions choice/grid), each combination once.

    Order: variants in file order, then dimensions in condition order, last dimension fastest.
    Keys whose conditions are off are absent (no code_size for a non-fsne trial). Repeats
    (search.repeats) are not multiplied in: that is the campaign layer's business.
    """
    ranges = [d.key for d in spec.space.dimensions if not d.enumerable]
    if ranges:
        raise SpecError([f"space.{k}: a range cannot be enumerated (expand_space needs choice/grid "
                         f"dimensions only)" for k in ranges], spec.source)
    base = base_config(spec)
    return [{**base, **combo} for combo in dimensions.expand(spec.space)]


SMOKE_EPOCHS = 2
SMOKE_STEPS = 2
SMOKE_BATCH_PER_WORKER = 4
SMOKE_TRIALS = 4


def smoke_test(spec: CampaignSpec, max_trials: int = SMOKE_TRIALS) -> CampaignSpec:
    """A validated copy of spec shrunk for a quick end-to-end run. It changes:

    - name: "<name>-smoke" (so it never mixes with the real experiment folder);
    - train: epochs <= 2, max_steps_per_epoch 2, batch_size 4 per worker (batch_per_worker unset,
      and batch keys dropped from the space), warmup_epochs 0, checkpoint_every 1;
    - search: at most max_trials trials; a larger grid keeps max_trials evenly spaced grid points
      (first and last included) as explicit variants; nsga2 population 2; gp and ehvi start-up trials
      their default for that budget; repeats 1; front_repeats at most 2;
    - scheduler: grace_epochs 1;
    - stages: every fine-tuning 1 epoch of max_steps_per_epoch updates of batch_size images.
    Model, data, objectives, constraints, resources and storage are kept (the point is to exercise them).
    """
    from qkvsearch.spaces.loader import load_campaign

    d = spec.to_dict()
    workers = spec.resources.workers_per_trial
    d["name"] = f"{spec.name}-smoke"
    d["train"].update(epochs=min(spec.train.epochs, SMOKE_EPOCHS), max_steps_per_epoch=SMOKE_STEPS,
                      batch_size=SMOKE_BATCH_PER_WORKER * workers, batch_per_worker=None,
                      warmup_epochs=0, checkpoint_every=1)
    d["space"] = _without_batch_keys(spec)
    if "stages" in d:  # every stage runs, shrunk alike
        d["stages"] = smoke_stages(d["stages"], SMOKE_BATCH_PER_WORKER * workers, SMOKE_STEPS)
    d["scheduler"].update(grace_epochs=1, brackets=None)  # brackets: as many as the shrunk epochs fit
    search = d["search"]
    if spec.search.front_repeats > 2:   # the phase runs, once more for each front configuration
        search["front_repeats"] = 2
    if spec.search.algorithm == "grid":
        search.update(repeats=1, num_trials=None)
        shrunk = load_campaign({**d, "search": search})
        size = dimensions.count(shrunk.space)
        if size > max_trials:
            step = (size - 1) / max(1, max_trials - 1)
            picks = {int(i * step + 0.5) for i in range(max_trials)}
            chosen = [c for i, c in enumerate(dimensions.iterate(shrunk.space)) if i in picks]
            d["space"] = {"variants": chosen} if any(chosen) else {}
    else:
        search["num_trials"] = min(spec.search.num_trials, max_trials)
        search.pop("repeats", None)
        search.pop("n_startup_trials", None)  # the default for the shrunk budget: the GP still leads
        if spec.search.algorithm == "nsga2":
            search["population_size"] = 2
    return load_campaign(d)


def _without_batch_keys(spec: CampaignSpec) -> dict:
    """The space as a dict with batch_size / batch_per_worker removed (duplicates and empties dropped)."""
    space = spec.space.to_dict()
    for key in ("batch_size", "batch_per_worker"):
        space.pop(key, None)
    if "variants" in space:
        kept, seen = [], set()
        for variant in space["variants"]:
            slim = {k: v for k, v in variant.items() if k not in ("batch_size", "batch_per_worker")}
            if slim and FrozenMap(slim) not in seen:
                seen.add(FrozenMap(slim))
                kept.append(slim)
        if kept:
            space["variants"] = kept
        else:
            space.pop("variants")
    return space


def suggest_config(spec: CampaignSpec, trial) -> dict:
    """One trial's space keys, drawn through an Optuna-style trial (define-by-run; no optuna import here).

    trial: anything with suggest_categorical / suggest_int / suggest_float (optuna.Trial), so
    ``OptunaSearch(space=lambda t: suggest_config(spec, t))`` works. Variants are one categorical
    parameter "variant" (their index); inactive dimensions are not suggested, hence absent.
    """
    return suggest_keys(spec.space, trial)


def suggest_keys(space, trial) -> dict:
    """suggest_config over a Space: the variant, then each active dimension in order."""
    config: dict = {}
    if space.variants:
        index = trial.suggest_categorical("variant", list(range(len(space.variants))))
        config.update(space.variants[index])
    for dim in space.dimensions:
        if not dim.active(config):
            continue
        if dim.enumerable:
            config[dim.key] = trial.suggest_categorical(dim.key, list(dim.values))
        elif dim.kind == "int":
            config[dim.key] = trial.suggest_int(dim.key, dim.low, dim.high, log=dim.log)
        else:
            config[dim.key] = trial.suggest_float(dim.key, dim.low, dim.high, log=dim.log)
    return config


def params_of(space, config: dict) -> tuple[dict, dict] | None:
    """The define-by-run parameters (``suggest_config``) and Optuna distributions that draw ``config``, or None
    when the space cannot draw it: the inverse of suggest_config, for results learnt from elsewhere."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    params, dists, chosen = {}, {}, {}
    if space.variants:
        index = next((i for i, v in enumerate(space.variants)
                      if all(tagged(config.get(k)) == tagged(val) for k, val in v.items())), None)
        if index is None:
            return None
        params["variant"], dists["variant"] = index, CategoricalDistribution(list(range(len(space.variants))))
        chosen.update(space.variants[index])
    for dim in space.dimensions:
        if not dim.active(chosen):
            continue
        value = config.get(dim.key)
        if dim.enumerable:
            if tagged(value) not in {tagged(v) for v in dim.values}:
                return None
            dist = CategoricalDistribution(list(dim.values))
        elif not isinstance(value, (int, float)) or isinstance(value, bool) or not dim.low <= value <= dim.high:
            return None
        elif dim.kind == "int":
            dist = IntDistribution(int(dim.low), int(dim.high), log=dim.log)
        else:
            dist = FloatDistribution(dim.low, dim.high, log=dim.log)
        params[dim.key], dists[dim.key], chosen[dim.key] = value, dist, value
    return params, dists


def neighbour_config(space, config: dict, rng, changes: int = 1) -> dict | None:
    """A configuration of ``space`` next to ``config``: its space keys with ``changes`` of its searched dimensions
    (the variant counting as one) drawn anew, each to another value where a choice has one; a dimension the
    change switches on (``when``, a block past the old depth) is drawn, one it switches off is dropped, every
    other keeps its value. rng: a numpy Generator, all the randomness there is (the same state, the same
    neighbour). None when ``config`` is not a configuration of the space, or nothing in it is searched."""
    found = params_of(space, config)
    if found is None:
        return None
    kept = found[0]
    movable = [k for k in kept if (len(space.variants) > 1 if k == "variant" else _searched(space.dimension(k)))]
    if not movable:
        return None
    picked = rng.choice(len(movable), size=min(changes, len(movable)), replace=False)
    return suggest_keys(space, _Redraw(kept, {movable[int(i)] for i in picked}, rng))


def _searched(dim) -> bool:
    return not dim.enumerable or len(dim.values) > 1


class _Redraw(RandomTrial):
    """The define-by-run trial of ``neighbour_config``: the ``kept`` parameters, except those ``redraw`` names
    and those ``kept`` lacks, which it draws as RandomTrial does (a choice redrawn: among its other values)."""

    def __init__(self, kept: dict, redraw: set, rng):
        super().__init__(rng)
        self.kept, self.redraw = kept, redraw

    def _keeps(self, name: str) -> bool:
        return name in self.kept and name not in self.redraw

    def suggest_categorical(self, name: str, choices: list):
        if self._keeps(name):
            return self.kept[name]
        other = [c for c in choices if name not in self.kept or tagged(c) != tagged(self.kept[name])]
        return super().suggest_categorical(name, other or list(choices))

    def suggest_int(self, name: str, low: int, high: int, log: bool = False) -> int:
        return self.kept[name] if self._keeps(name) else super().suggest_int(name, low, high, log)

    def suggest_float(self, name: str, low: float, high: float, log: bool = False) -> float:
        return self.kept[name] if self._keeps(name) else super().suggest_float(name, low, high, log)
