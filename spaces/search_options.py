"""The search algorithms a campaign file may name (``search.algorithm``: each its searcher's class, ``SEARCHERS``)
and the options each reads, with their defaults: declared once, read by the spec loader (spaces.loader), the
searchers (search.searchers.searcher_class) and `qkvsearch simulate`.
"""
from __future__ import annotations

from qkvsearch.spaces import dimensions
from qkvsearch.spaces.checks import MAX_COUNT, POS_INT, SEED, integer, one_of
from qkvsearch.spaces.errors import Collector, section_failed
from qkvsearch.spaces.fields import Field, nonempty, read_table, section_spec, table
from qkvsearch.spaces.metrics import COUNTED_METRICS, MEASURED_METRICS
from qkvsearch.spaces.schema import Space
from qkvsearch.spaces.sections import as_mapping

# A searcher is its class (a search.searchers.base.Searcher) and its row here: the name a campaign file gives
# (search.algorithm) -> "module:Class", imported when a campaign or `simulate` asks for it
# (search.searchers.searcher_class). An option of its own is a SEARCH_FIELDS row that applies to it.
_HOME = "qkvsearch.search.searchers"
SEARCHERS = {
    "grid": f"{_HOME}.grid:GridSearcher",
    "random": f"{_HOME}.optuna_samplers:RandomSearcher",
    "tpe": f"{_HOME}.optuna_samplers:TPESearcher",
    "nsga2": f"{_HOME}.optuna_samplers:NSGA2Searcher",
    "gp": f"{_HOME}.optuna_samplers:GPSearcher",
    "ehvi": f"{_HOME}.ehvi:EhviSearcher",
    "mfehvi": f"{_HOME}.mfehvi:MFEhviSearcher",
}
ALGORITHMS = tuple(SEARCHERS)
# What `qkvsearch simulate --searcher` offers: the campaign's algorithms but grid, and shuffle (every recorded
# curve once, in an order drawn from the seed).
SIMULATED_SEARCHERS = ("shuffle", *(a for a in ALGORITHMS if a != "grid"))
# algorithms that model one training objective and search over cost objectives known before training (ehvi_problem)
EHVI_ALGORITHMS = ("ehvi", "mfehvi")
# gp, ehvi, mfehvi: random proposals before the model leads. gp: Optuna's default; ehvi and mfehvi: chosen with
# their other settings on tables left out of the choice (benchmarks/README.md, "ehvi's settings chosen on tables
# left out" and "Multi-fidelity search"; search.searchers.ehvi_core and mfehvi read them)
STARTUP_TRIALS = {"gp": 10, "ehvi": 20, "mfehvi": 10}
GP_STARTUP_TRIALS = STARTUP_TRIALS["gp"]
NSGA2_POPULATION = 50    # nsga2: Optuna's default population

# The section's fields (spaces.fields), and its spec made of them; defaults: where they do not depend on the rest.
# The options of some algorithms only are written back only when set.
SEARCH_FIELDS = table(
    Field("algorithm", one_of(*ALGORITHMS), None, "the searcher that proposes trials",
          default_doc="grid when every dimension is a choice; else, for several objectives, ehvi when there is one "
                      "training objective and one or two counted costs, else gp; random for one objective"),
    Field("num_trials", POS_INT, None, "trials to run (proposals a one-shot campaign scores)",
          default_doc="required, except for grid: grid points x repeats"),
    Field("seed", SEED, 0, "seed of the searcher's draws"),
    Field("population_size", integer(2, MAX_COUNT), None, "NSGA-II's population",
          default_doc=f"min({NSGA2_POPULATION}, num_trials // 2), at least 2", applies=("nsga2",), added_later=True),
    # written back when set, and a grid's always (search_dict)
    Field("repeats", POS_INT, 1, "runs of each configuration proposed, under the seeds seed, seed + 1, ...; the "
          "searcher learns each configuration from its first (grid: of each grid point)",
          default_doc="1; for a searcher other than grid num_trials counts every run", added_later=True),
    Field("front_repeats", POS_INT, 1,
          "once the search ends, each configuration on the front of the completed trials trains again under the "
          "next seeds until it has run this many times (each front point's mean and spread in the report)",
          added_later=True),
    Field("n_startup_trials", POS_INT, None,
          "random trials before the model leads; fewer than num_trials",
          default_doc=", ".join(f"min({n}, num_trials // 4) for {a}" for a, n in STARTUP_TRIALS.items())
          + ", at least 1", applies=tuple(STARTUP_TRIALS), added_later=True),
    Field("warm_start", nonempty("a campaign folder or URI (a string)"), None,
          "a finished campaign whose trials this space can draw are known from the start, never retrained",
          added_later=True),
)
SearchSpec = section_spec("SearchSpec", SEARCH_FIELDS, __name__, "The search section (SEARCH_FIELDS).")
_section_dict = SearchSpec.to_dict


def search_dict(spec) -> dict:
    """SearchSpec.to_dict: the section's table (spaces.fields.section_spec), where ``repeats`` is a grid's always
    (its size counts them) and another searcher's only when set, as earlier campaign files hold it."""
    out = _section_dict(spec)
    if spec.algorithm != "grid" or "repeats" in out:
        return out
    return {f.name: spec.repeats if f.name == "repeats" else out[f.name] for f in SEARCH_FIELDS.values()
            if f.name in out or f.name == "repeats"}


SearchSpec.to_dict = search_dict
# search keys that only some algorithms read -> those algorithms
OPTIONS = {f.name: f.applies for f in SEARCH_FIELDS.values() if f.applies}


def startup_cap(algorithm: str) -> int:
    return STARTUP_TRIALS[algorithm]


def default_startup(num_trials: int, algorithm: str = "gp") -> int:
    """n_startup_trials when the file gives none: the algorithm's (startup_cap), or a quarter of a smaller
    budget."""
    return max(1, min(startup_cap(algorithm), num_trials // 4))


def default_population(num_trials: int) -> int:
    """population_size when the file gives none: Optuna's default, or half of a smaller budget."""
    return max(2, min(NSGA2_POPULATION, num_trials // 2))


def ehvi_problem(metrics, costs=COUNTED_METRICS, measured=MEASURED_METRICS) -> str | None:
    """Why search.algorithm ehvi (search.searchers.ehvi) cannot serve objectives of these metrics, or None: it
    needs one training objective and one or two cost objectives, each counted before training (``costs``: a
    campaign's counted metrics by default) or measured before training (``measured``: spaces.metrics.MEASURED
    by default)."""
    metrics = list(metrics)
    known = [m for m in metrics if m in costs or m in measured]
    if len(metrics) - len(known) == 1 and 1 <= len(known) <= 2:
        return None
    what = f"counted ({', '.join(costs)})" + (f" or measured ({', '.join(measured)})" if measured else "")
    return (f"ehvi expects one training objective and one or two cost objectives {what} before training, "
            f"given {', '.join(metrics)}")


def parse_search(raw, space: Space, c: Collector, objectives=()) -> SearchSpec:
    raw = as_mapping(raw, c, "search", "a mapping (algorithm, num_trials, seed, ...)")
    if raw is None:
        raw = {}
    fields = SEARCH_FIELDS
    c.unknown_keys("search", raw, fields)
    # A space with errors lost dimensions: its size and default algorithm would contradict the user.
    space_ok = not _failed(c, "space")
    # A space of ranges, several objectives: ehvi where it applies, else GP (benchmarks/README.md, "Searchers
    # compared": on NAS-Bench-201 CIFAR-10 and CIFAR-100, ehvi holds the most hypervolume at 50 trained
    # configurations, then GP); random for one objective.
    known_cost = ehvi_problem(o.metric for o in objectives)
    counted_only = ehvi_problem((o.metric for o in objectives), measured=())
    several = ("ehvi" if counted_only is None else "gp") if len(objectives) > 1 else "random"
    default_algorithm = "grid" if space.enumerable else several
    algorithm = dimensions.check_value(fields["algorithm"].check, raw.get("algorithm", default_algorithm),
                                       c, "search.algorithm")
    # A key that does not apply to the algorithm is reported as such, without also judging its value.
    values = read_table(raw, fields, c, "search", algorithm=lambda *_: algorithm,
                        repeats=lambda given, c, path: fields["repeats"].read(raw, c, "search", default=None),
                        population_size=_only_for(raw, fields["population_size"], algorithm),
                        n_startup_trials=_only_for(raw, fields["n_startup_trials"], algorithm))
    num_trials, repeats, startup = values["num_trials"], values["repeats"], values["n_startup_trials"]
    if algorithm is dimensions.ABSENT:
        return SearchSpec(**{**values, "algorithm": "random", "num_trials": num_trials or 1, "repeats": 1})
    if algorithm != "grid" and ("algorithm" in raw or space_ok):
        ranges = [d.key for d in space.dimensions if not d.enumerable]
        why = (f"given {algorithm}" if "algorithm" in raw
               else f"the default is {default_algorithm} because space.{ranges[0]} is a range" if ranges else "")
        for dim in space.dimensions:
            if dim.kind == "grid":
                c.add(f"space.{dim.key}.grid", f"grid values are enumerated, which only search.algorithm grid "
                                               f"does ({why}); use choice")
    if algorithm == "grid":
        if raw.get("repeats") is not None and repeats is None:   # no size to compare num_trials with
            return SearchSpec(**{**values, "num_trials": num_trials or 1, "repeats": 1})
        repeats = repeats or 1
        return SearchSpec(**{**values, "repeats": repeats,
                             "num_trials": _grid_trials(space, num_trials, repeats, c, space_ok)})
    if num_trials is None:
        if raw.get("num_trials") is None:
            c.add("search.num_trials", f"required for algorithm {algorithm} (how many trials to run)")
        num_trials = 1
    elif num_trials > 1 and space_ok and space.enumerable and dimensions.count(space) == 1:
        c.warn("search.num_trials", f"the space holds one configuration, so all {num_trials} trials would train "
                                    "the same one (add space dimensions, or set num_trials: 1)")
    repeats = repeats or 1
    if repeats > 1 and num_trials % repeats:
        c.add("search.num_trials", f"expected a multiple of search.repeats ({repeats}): each configuration proposed "
                                   f"runs {repeats} times, and num_trials counts every run; given {num_trials}")
    proposals = max(1, num_trials // repeats)   # what the searcher proposes; its defaults are sized on them
    if algorithm == "nsga2" and values["population_size"] is None:
        values["population_size"] = default_population(proposals)
    if algorithm in EHVI_ALGORITHMS and known_cost:
        c.add("search.algorithm", known_cost)
    if algorithm in OPTIONS["n_startup_trials"] and startup is None:
        startup = default_startup(proposals, algorithm)
    elif startup is not None and 1 < proposals <= startup:  # one trial: nothing could make the GP lead
        c.add("search.n_startup_trials", f"expected fewer than the proposals search.num_trials / search.repeats "
                                         f"({proposals}), given {startup}: "
                                         f"every trial would be a random start-up one and the Gaussian process "
                                         f"would never lead (leave it out for min({startup_cap(algorithm)}, "
                                         f"num_trials // 4))")
    return SearchSpec(**{**values, "num_trials": num_trials, "repeats": repeats, "n_startup_trials": startup})


def _grid_trials(space: Space, num_trials, repeats, c: Collector, space_ok: bool = True) -> int:
    """The trials a grid runs: its points x repeats (num_trials as given where the space has a range)."""
    ranges = [d.key for d in space.dimensions if not d.enumerable]
    if ranges:
        c.add("search.algorithm", "grid needs every dimension to be choice/grid, but "
                                  + ", ".join(f"space.{k}" for k in ranges) + " is a range")
        return num_trials or 1
    points = dimensions.count(space)   # counted, not enumerated: a grid may hold 10^8 points
    size = points * repeats
    if not space_ok:
        return size
    if num_trials is not None and num_trials != size:
        c.add("search.num_trials", f"grid runs every grid point x repeats = {size} trials, given {num_trials} "
                                   "(leave num_trials out)")
    elif points == 1 and repeats > 1:
        c.warn("search.repeats", f"the space holds one configuration, so all {repeats} repeats would train "
                                 "the same one (add space dimensions, or leave repeats out)")
    return size


def _only_for(raw: dict, field: Field, algorithm, advice: str = ""):
    """The reader (spaces.fields.read_table) of a search key that only some algorithms read (``field.applies``):
    None when absent, invalid or not applicable."""
    def read(given, c: Collector, path: str):
        if given is None:
            return None
        if algorithm is not dimensions.ABSENT and algorithm not in field.applies:
            c.add(path, f"applies to algorithm {', '.join(field.applies)} only, not {algorithm}{advice}")
            return None
        return field.read(raw, c, "search", default=None)

    return read


def _failed(c: Collector, section: str) -> bool:
    """Whether an error was recorded under a section ("space", "space.x", "space[0]")."""
    return section_failed(c.errors, section)
