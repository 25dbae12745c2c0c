"""The search algorithms a campaign file may name (``search.algorithm``) and the options each reads, with
their defaults: declared once, read by the spec loader (spaces.loader), the searchers
(search.searchers.SEARCHERS, one entry per name here) and `qkvsearch simulate`.
"""
from __future__ import annotations

from dataclasses import replace

from qkvsearch.spaces import dimensions
from qkvsearch.spaces.checks import MAX_COUNT, POS_INT, SEED, integer, one_of
from qkvsearch.spaces.errors import Collector, section_failed
from qkvsearch.spaces.fields import Field, nonempty, table
from qkvsearch.spaces.metrics import COUNTED_METRICS, MEASURED_METRICS
from qkvsearch.spaces.schema import SearchSpec, Space
from qkvsearch.spaces.sections import as_mapping

ALGORITHMS = ("grid", "random", "tpe", "nsga2", "gp", "ehvi", "mfehvi")
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

# The section's fields (spaces.fields); defaults: SearchSpec's, where they do not depend on the rest.
SEARCH_FIELDS = table(
    Field("algorithm", one_of(*ALGORITHMS), None, "the searcher that proposes trials",
          default_doc="grid when every dimension is a choice; else, for several objectives, ehvi when there is one "
                      "training objective and one or two counted costs, else gp; random for one objective"),
    Field("num_trials", POS_INT, None, "trials to run (proposals a one-shot campaign scores)",
          default_doc="required, except for grid: grid points x repeats"),
    Field("seed", SEED, SearchSpec.seed, "seed of the searcher's draws"),
    Field("population_size", integer(2, MAX_COUNT), SearchSpec.population_size, "NSGA-II's population",
          default_doc=f"min({NSGA2_POPULATION}, num_trials // 2), at least 2", applies=("nsga2",)),
    Field("repeats", POS_INT, SearchSpec.repeats, "runs of each configuration proposed, under the seeds seed, "
          "seed + 1, ...; the searcher learns each configuration from its first (grid: of each grid point)",
          default_doc="1; for a searcher other than grid num_trials counts every run"),
    Field("front_repeats", POS_INT, SearchSpec.front_repeats,
          "once the search ends, each configuration on the front of the completed trials trains again under the "
          "next seeds until it has run this many times (each front point's mean and spread in the report)"),
    Field("n_startup_trials", POS_INT, SearchSpec.n_startup_trials,
          "random trials before the model leads; fewer than num_trials",
          default_doc=", ".join(f"min({n}, num_trials // 4) for {a}" for a, n in STARTUP_TRIALS.items())
          + ", at least 1", applies=tuple(STARTUP_TRIALS)),
    Field("warm_start", nonempty("a campaign folder or URI (a string)"), SearchSpec.warm_start,
          "a finished campaign whose trials this space can draw are known from the start, never retrained"),
)
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
    seed = fields["seed"].read(raw, c, "search")
    # A key that does not apply to the algorithm is reported as such, without also judging its value.
    repeats = fields["repeats"].read(raw, c, "search", default=None)
    front_repeats = fields["front_repeats"].read(raw, c, "search")
    population = _only_for(raw, fields["population_size"], algorithm, c)
    startup = _only_for(raw, fields["n_startup_trials"], algorithm, c)
    warm = fields["warm_start"].read(raw, c, "search")
    num_trials = fields["num_trials"].read(raw, c, "search")
    if algorithm is dimensions.ABSENT:
        return SearchSpec("random", num_trials or 1, seed)
    if algorithm != "grid" and ("algorithm" in raw or space_ok):
        ranges = [d.key for d in space.dimensions if not d.enumerable]
        why = (f"given {algorithm}" if "algorithm" in raw
               else f"the default is {default_algorithm} because space.{ranges[0]} is a range" if ranges else "")
        for dim in space.dimensions:
            if dim.kind == "grid":
                c.add(f"space.{dim.key}.grid", f"grid values are enumerated, which only search.algorithm grid "
                                               f"does ({why}); use choice")
    if algorithm == "grid":
        if raw.get("repeats") is not None and repeats is None:
            return SearchSpec("grid", num_trials or 1, seed)   # no size to compare num_trials with
        grid = _grid_search(space, num_trials, seed, repeats or 1, c, space_ok)
        return replace(grid, warm_start=warm, front_repeats=front_repeats)
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
    if algorithm == "nsga2" and population is None:
        population = default_population(proposals)
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
    return SearchSpec(algorithm, num_trials, seed, population, repeats, startup, warm, front_repeats)


def _grid_search(space: Space, num_trials, seed, repeats, c: Collector, space_ok: bool = True) -> SearchSpec:
    ranges = [d.key for d in space.dimensions if not d.enumerable]
    if ranges:
        c.add("search.algorithm", "grid needs every dimension to be choice/grid, but "
                                  + ", ".join(f"space.{k}" for k in ranges) + " is a range")
        return SearchSpec("grid", num_trials or 1, seed, None, repeats)
    points = dimensions.count(space)   # counted, not enumerated: a grid may hold 10^8 points
    size = points * repeats
    if not space_ok:
        return SearchSpec("grid", size, seed, None, repeats)
    if num_trials is not None and num_trials != size:
        c.add("search.num_trials", f"grid runs every grid point x repeats = {size} trials, given {num_trials} "
                                   "(leave num_trials out)")
    elif points == 1 and repeats > 1:
        c.warn("search.repeats", f"the space holds one configuration, so all {repeats} repeats would train "
                                 "the same one (add space dimensions, or leave repeats out)")
    return SearchSpec("grid", size, seed, None, repeats)


def _only_for(raw: dict, field: Field, algorithm, c: Collector, advice: str = ""):
    """The value of a search key that only some algorithms read (``field.applies``); None when absent, invalid
    or not applicable."""
    if raw.get(field.name) is None:
        return None
    if algorithm is not dimensions.ABSENT and algorithm not in field.applies:
        c.add(f"search.{field.name}", f"applies to algorithm {', '.join(field.applies)} only, not {algorithm}{advice}")
        return None
    return field.read(raw, c, "search", default=None)


def _failed(c: Collector, section: str) -> bool:
    """Whether an error was recorded under a section ("space", "space.x", "space[0]")."""
    return section_failed(c.errors, section)
