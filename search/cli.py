"""`qkvsearch`: launch, resume, watch and report search campaigns over QKV embeddings (exit codes: _EPILOG)."""
from __future__ import annotations

import argparse
import logging
import sys
import textwrap
import traceback

from qkvsearch.search.monitor.stdout import GuardedStdout, OutputFailed

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
# Not a failure of qkvsearch (1) nor of its input (2): the campaign ran, and no trial trained. Scripts that
# chain a launch with its report tell it apart.
EXIT_ALL_FAILED = 3
MESSAGE_LIMIT = 4000   # characters of a bad-input message; the rest is cut
GP_ESTIMATE_TRIALS = 12  # validate: a GP suggestion costs about a second here

_EPILOG = textwrap.dedent("""\
    examples:
      qkvsearch validate spaces/presets/quickstart.yaml
      qkvsearch cost spaces/presets/paper-s.yaml          # params and MACs of every configuration
      qkvsearch launch spaces/presets/quickstart.yaml     # a small real campaign on local Ray
      qkvsearch launch my.yaml --set train.epochs=20 --set search.num_trials=16
      qkvsearch status results/quickstart
      qkvsearch watch results/quickstart                  # live trials, front and hypervolume until it ends
      qkvsearch report results/quickstart                 # pareto.html, pareto.csv, report.md, Parquet

    Ray: a local Ray is started on 127.0.0.1 unless RAY_ADDRESS names a cluster.

    exit codes: 0 done; 2 bad input (spec, path, data, resources; a closed or full standard output), with a
      message and no traceback; 1 failure (a bug or a library error), with its traceback; 3 launch or resume:
      every trial failed (the first trial's error is printed); 130 interrupted (Ctrl-C).
    """)


_TRACK_HELP = ("also log the campaign to a tracker: mlflow, wandb, tensorboard or optuna (repeatable; settings: "
               "the campaign file's tracking section)")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="qkvsearch", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_EPILOG,
        description="Search the query/key/value embedding of vision transformers (linear, SNE, P-SNE, "
                    "F-SNE) with Ray Tune; every trial trains with PyTorch DDP on a Ray Train worker group.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_spec_commands(sub)
    _add_campaign_commands(sub)
    _add_simulate(sub)
    from qkvsearch.search.analysis.compare_command import add_compare_parser  # its command: args.run
    from qkvsearch.search.campaign.oneshot.export import add_export_parser  # torch loads only as it runs
    for add_parser in (add_export_parser, add_compare_parser):
        add_parser(sub)
    return p


def _add_spec_commands(sub) -> None:
    """Commands that take a campaign file: launch, validate, cost."""

    def with_spec(name, help_):
        cmd = sub.add_parser(name, help=help_, description=help_)
        cmd.add_argument("spec", metavar="SPEC", help="campaign YAML file (see spaces/presets/)")
        cmd.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                         help="override a spec value, e.g. --set train.epochs=3 (repeatable)")
        return cmd

    launch = with_spec("launch", "run a search campaign to the end")
    launch.add_argument("--smoke-test", action="store_true",
                        help="shrink the campaign to a quick end-to-end check (few trials, 1-2 short epochs)")
    launch.add_argument("--overwrite", action="store_true",
                        help="replace an existing campaign of the same name instead of refusing")
    launch.add_argument("--verbose", action="store_true", help="print Ray Tune's trial tables as well")
    launch.add_argument("--track", action="append", default=[], metavar="NAME", help=_TRACK_HELP)
    with_spec("validate", "check a spec and summarise it, without starting anything")
    cost = with_spec("cost", "params and MACs of every configuration in the space, without training")
    cost.add_argument("--csv", action="store_true", help="print CSV instead of a table")


def _add_campaign_commands(sub) -> None:
    """Commands that take a campaign's folder (resume, status, watch, report) and grafana-dashboard."""
    resume = sub.add_parser("resume", help="continue an interrupted campaign from its folder")
    resume.add_argument("dir", metavar="DIR", help="the campaign's results folder, e.g. results/quickstart")
    resume.add_argument("--verbose", action="store_true", help="print Ray Tune's trial tables as well")
    resume.add_argument("--track", action="append", default=[], metavar="NAME", help=_TRACK_HELP)
    status = sub.add_parser("status", help="one line per trial of a campaign (running or finished)")
    status.add_argument("dir", metavar="DIR")
    watch = sub.add_parser("watch", help="follow a campaign's trials, front and hypervolume until it ends",
                           description="Redraw a campaign's progress (trials, epochs, running trials, the "
                                       "completed front and its hypervolume) from its records every few seconds, "
                                       "until its driver records the end. DIR: a folder or a storage URI.")
    watch.add_argument("dir", metavar="DIR")
    watch.add_argument("--interval", type=float, default=None, metavar="S", help="seconds between reads (default 2)")
    watch.add_argument("--once", action="store_true", help="show the progress once and exit")
    grafana = sub.add_parser("grafana-dashboard", help="write the qkvsearch campaign Grafana dashboard JSON",
                             description="Write the 'qkvsearch campaign' Grafana dashboard (campaign metrics, "
                                         "Ray node utilisation, Train controller state) for a Grafana of one's "
                                         "own; `launch` installs it into the Grafana Ray's head provisions.")
    grafana.add_argument("--out", metavar="DIR", required=True, help="folder to write it into")
    report = sub.add_parser("report", help="write the Pareto report (HTML, CSV, Markdown, Parquet, figures)")
    report.add_argument("dir", metavar="DIR")
    report.add_argument("--out", metavar="OUT", default=None, help="output folder (default DIR/report)")
    report.add_argument("--no-static", action="store_true",
                        help="skip the png/svg copies of the figures (they need a Chromium; pareto.html has them all)")


def _add_simulate(sub) -> None:
    simulate = sub.add_parser(
        "simulate", help="replay scheduler settings on recorded learning curves, without training",
        description="Replay a campaign's searcher and scheduler settings side by side on recorded learning "
                    "curves (a campaign folder, or a tabular benchmark file; format: qkvsearch.search.simulation) "
                    "and print the completed front's hypervolume against simulated time and epochs spent.")
    simulate.add_argument("source", metavar="SOURCE",
                          help="a campaign folder (e.g. results/quickstart), a .parquet/.csv table of curves, or a "
                               "packaged benchmark: nb201:<dataset>, hpolib:<dataset>, hpobench:<dataset>")
    simulate.add_argument("--schedulers", nargs="+", metavar="SETTING", default=None,
                          help="TYPE[:grace=G,rf=R,brackets=B], TYPE fifo, asha or moasha, e.g. fifo "
                               "moasha moasha:brackets=3 (default: fifo, asha, moasha with 1-3 brackets at "
                               "the campaign's grace and rf)")
    simulate.add_argument("--concurrency", type=int, default=None, metavar="N",
                          help="trials at once (default: the campaign's max_concurrent_trials, else 4)")
    simulate.add_argument("--startup-s", type=float, default=None, metavar="S",
                          help="seconds each trial spends before its first epoch (default: estimated from a "
                               "campaign's records; 0 for a table)")
    simulate.add_argument("--seed", type=int, default=0, metavar="K", help="orders the trials (default 0)")
    simulate.add_argument("--trials", type=int, default=None, metavar="N",
                          help="trials per setting (default: every recorded curve once)")
    from qkvsearch.spaces.search_options import SIMULATED_SEARCHERS

    simulate.add_argument("--searcher", nargs="+", default=["shuffle"], metavar="NAME",
                          choices=SIMULATED_SEARCHERS,
                          help="the campaign's searchers over the table's configurations: "
                               f"{', '.join(SIMULATED_SEARCHERS[1:])}; shuffle (default): every recorded curve "
                               "once, in an order drawn from the seed. Several: each x each scheduler setting")
    simulate.add_argument("--constraints", nargs="+", default=None, metavar="METRIC:max=X",
                          help="cost constraints (METRIC:max=X, METRIC:min=X) on the table's cost columns: an "
                               "infeasible proposal takes no trial slot and the searcher learns it")
    simulate.add_argument("--objectives", default=None, metavar="METRIC:MODE,...",
                          help="e.g. top1:max,params_m:min (default: the campaign's; for a table those of "
                               "top1:max, gmacs:min, params_m:min it has)")
    simulate.add_argument("--out", metavar="OUT", default=None,
                          help="output folder (default DIR/simulate, or <file>-simulate next to a table)")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from qkvsearch.spaces import BadInput

    handler = _attach_log_handler()
    out = sys.stdout = GuardedStdout(sys.stdout)
    try:
        code = (_COMMANDS.get(args.command) or args.run)(args)
        out.flush()  # what is still buffered fails here, not when the interpreter exits
        return _output_failed(args, out) if out.failed else code
    except OutputFailed:
        return _output_failed(args, out)
    except BadInput as err:
        text = str(err) if len(str(err)) <= MESSAGE_LIMIT else str(err)[:MESSAGE_LIMIT - 1] + "…"
        print(f"qkvsearch {args.command}: {text}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as err:
        detail = str(err) or "interrupted; `qkvsearch resume DIR` continues a campaign"
        print(f"qkvsearch {args.command}: {detail}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception:
        traceback.print_exc()
        print(f"qkvsearch {args.command}: failed (the traceback above says where)", file=sys.stderr)
        return EXIT_FAILURE
    finally:
        sys.stdout = out.stream
        _detach_log_handler(handler)


def _output_failed(args, out) -> int:
    """One line on stderr (search.monitor.stdout: nothing else of the command's is lost); exit 2."""
    out.silence()
    why = out.failed.strerror or type(out.failed).__name__
    print(f"qkvsearch {args.command}: stdout: expected an output that takes what the command prints, given one "
          f"that failed ({why}); nothing else was lost", file=sys.stderr)
    return EXIT_BAD_INPUT


class _LineHandler(logging.Handler):
    """INFO records as plain lines on stdout, WARNING and above as "warning: ..." on stderr.

    The streams are looked up per record, so a caller that swaps sys.stdout/sys.stderr sees them.
    """

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
            if record.levelno >= logging.WARNING:
                print(f"{record.levelname.lower()}: {text}", file=sys.stderr, flush=True)
            else:
                print(text, file=sys.stdout, flush=True)
        except OutputFailed:  # the command says so once it ends (main)
            pass
        except Exception:  # logging must not take the command down
            self.handleError(record)


def _attach_log_handler() -> tuple[logging.Handler, int]:
    logger = logging.getLogger("qkvsearch")
    handler = _LineHandler(logging.INFO)
    logger.addHandler(handler)
    level = logger.level
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    return handler, level


def _detach_log_handler(attached: tuple[logging.Handler, int]) -> None:
    handler, level = attached
    logger = logging.getLogger("qkvsearch")
    logger.removeHandler(handler)
    logger.setLevel(level)


def _load(args):
    from qkvsearch.spaces import load_campaign

    return load_campaign(args.spec, overrides=args.overrides)


def cmd_launch(args) -> int:
    spec = _load(args)
    if args.track:
        from qkvsearch.spaces.tracking import add_trackers

        spec = add_trackers(spec, args.track)
    if args.overwrite:  # as resume: a campaign a live driver holds is refused before the launcher's imports
        from qkvsearch.search.records import layout, lease

        lease.refuse_if_held(layout.experiment_dir(spec))
    from qkvsearch.search.campaign.launch import launch
    from qkvsearch.search.monitor.terminal import TerminalView

    view = TerminalView()
    exp = launch(spec, smoke=args.smoke_test, overwrite=args.overwrite, verbose=args.verbose, view=view)
    return _closing(exp, view)


def cmd_resume(args) -> int:
    from qkvsearch.search.records.lease import refuse_if_held

    refuse_if_held(args.dir)  # before the launcher's imports (seconds): a held campaign is refused at once
    from qkvsearch.search.campaign.launch import resume
    from qkvsearch.search.monitor.terminal import TerminalView

    view = TerminalView()
    return _closing(resume(args.dir, verbose=args.verbose, view=view, track=args.track), view)


def _closing(exp: str, view) -> int:
    from qkvsearch.search.monitor.progress import read_progress
    from qkvsearch.search.monitor.terminal import closing_summary

    progress = read_progress(exp)
    print(closing_summary(progress, exp, shown=view.last_line))
    return closing_code(progress, exp)


def closing_code(progress, exp: str) -> int:
    """How `launch` and `resume` exit once the campaign ended: EXIT_ALL_FAILED, with the first trial's error on
    stderr, when every trial failed (search.monitor.terminal.all_failed); else EXIT_OK."""
    from qkvsearch.search.monitor.terminal import all_failed

    first = all_failed(progress)
    if first is None:
        return EXIT_OK
    print(f"qkvsearch: every trial failed; the first: {first} (`qkvsearch status {exp}` shows each error)",
          file=sys.stderr)
    return EXIT_ALL_FAILED


def cmd_validate(args) -> int:
    spec = _load(args)
    from qkvsearch.search.campaign.preflight import check_spec, describe_input_path

    models = check_spec(spec, launching=False)  # storage, every model, dataset: what launch checks first
    d = spec.to_dict()
    blocks = _per_block_keys(d["space"])
    distinct = f"{len(models)} with every block alike (and mixtures of their blocks)" if blocks else \
        f"{len(models)} distinct"
    objectives = ", ".join(f"{o['mode']} {o['metric']}" for o in d["objectives"])
    print(f"{args.spec}: valid\n  name: {d['name']}\n  model: {d['model']['name']} at {d['model']['img_size']}px\n"
          f"  data: {d['data']['dataset']}\n  space: {_space_keys(d['space'], blocks) or '(none)'}\n"
          f"  objectives: {objectives}\n  search: {d['search']['algorithm']}, "
          f"{d['search'].get('num_trials')} trials\n  scheduler: {d['scheduler']['type']}\n"
          f"  configurations: {_distinct(spec)}\n"
          f"  models: {distinct}, {_span(c['params_m'] for _, c in models)} M params, "
          f"{_span(c['gmacs'] for _, c in models)} GMACs")
    if spec.supernet:
        sn = spec.supernet
        trains = f"{sn.recipe.get('epochs')} epoch(s)" if sn.source is None else f"taken from {sn.source}"
        chosen = "the inherited front" if sn.retrain == "front" else f"the top {sn.top_k}"
        print(f"  one-shot: a supernet over the space's models ({trains}); "
              f"{d['search'].get('num_trials')} subnets scored with inherited weights; {chosen} retrained, "
              f"and {sn.control} control subnet(s) under two seeds")
    if spec.constraints and spec.search.algorithm != "grid":
        print(f"  infeasible proposals (estimated, no trial slot): {_infeasible_shares(spec)}")
    print("\n".join(f"  {line}" for line in describe_input_path(spec)))   # and what it prepares, where
    return EXIT_OK


def _per_block_keys(space: dict) -> dict[str, int]:
    """key -> how many blocks draw it, for the keys a space draws per block."""
    from qkvsearch.spaces.blocks import split_block_key

    out: dict[str, int] = {}
    for name in space:
        if split := split_block_key(name):
            out[split[0]] = out.get(split[0], 0) + 1
    return out


def _space_keys(space: dict, blocks: dict[str, int]) -> str:
    """The searched keys in words, a key drawn per block once: "depth, embedding per block (12)"."""
    from qkvsearch.spaces.blocks import split_block_key

    shown = [k for k in space if not split_block_key(k)]
    return ", ".join(shown + [f"{k} per block ({n})" for k, n in blocks.items()])


def _infeasible_shares(spec) -> str:
    """Per searcher, the share of proposals that break the constraints (searchers.infeasible_share)."""
    from qkvsearch.search.campaign.assemble import ESTIMATE_TRIALS, infeasible_share
    from qkvsearch.spaces.search_options import ALGORITHMS, EHVI_ALGORITHMS, ehvi_problem

    ehvi_cannot = ehvi_problem(o.metric for o in spec.objectives)
    searchers = [a for a in ALGORITHMS if a != "grid" and not (a in EHVI_ALGORITHMS and ehvi_cannot)]
    shares = {a: infeasible_share(spec, a, ESTIMATE_TRIALS if a != "gp" else GP_ESTIMATE_TRIALS) for a in searchers}
    return (", ".join(f"{a} {v:.0%}" for a, v in shares.items())
            + f" (over {ESTIMATE_TRIALS} trials; gp {GP_ESTIMATE_TRIALS})")


def _distinct(spec) -> str:
    from qkvsearch.search.campaign.costs import distinct_configurations
    from qkvsearch.spaces import dimensions

    if not spec.space.enumerable:
        return "ranges: sampled, each distinct configuration trained once"
    n, distinct = dimensions.count(spec.space), distinct_configurations(spec)
    shown = "not counted (large grid)" if distinct is None else f"{distinct} distinct"
    return f"{n} in the space, {shown}; a configuration seen before is not trained again"


def _span(values) -> str:
    values = list(values)
    lo, hi = min(values), max(values)
    return f"{lo:.3g}" if lo == hi else f"{lo:.3g}-{hi:.3g}"


def cmd_cost(args) -> int:
    spec = _load(args)   # a bad spec is refused before the model libraries load
    from qkvsearch.search.campaign.costs import cost_table, format_table

    print(format_table(cost_table(spec), as_csv=args.csv))
    return EXIT_OK


def cmd_status(args) -> int:
    from qkvsearch.search.monitor.status import status_table
    print(status_table(args.dir))
    return EXIT_OK


def cmd_export(args) -> int:
    from qkvsearch.search.campaign.oneshot.export import cmd_export as export
    return export(args)


def cmd_report(args) -> int:
    from qkvsearch.search.analysis.report import build_report

    written = build_report(args.dir, out_dir=args.out, static=not args.no_static)
    for kind, path in written.items():
        print(f"{kind}: {path}")
    return EXIT_OK


def cmd_watch(args) -> int:
    from qkvsearch.search.monitor.terminal import TerminalView
    from qkvsearch.search.monitor.watch import INTERVAL_S, watch
    from qkvsearch.spaces import BadInput

    interval = INTERVAL_S if args.interval is None else args.interval
    if not interval > 0:
        raise BadInput(f"--interval: expected a number of seconds > 0, given {args.interval}")
    progress = watch(args.dir, TerminalView(), interval=interval, until_ended=not args.once)
    if progress.ended:
        print(f"{progress.name} has ended; `qkvsearch report {args.dir}` writes its report")
    return EXIT_OK


def cmd_grafana_dashboard(args) -> int:
    from qkvsearch.search.monitor.grafana import write_dashboard
    from qkvsearch.search.records.outputs import check_output_dir

    print(f"grafana dashboard: {write_dashboard(check_output_dir(args.out, '--out', uris=False))}")
    return EXIT_OK


def cmd_simulate(args) -> int:
    from qkvsearch.search import simulation as sim
    from qkvsearch.search.simulation.output import checked_out_dir
    from qkvsearch.search.simulation.replay import DEFAULT_CONCURRENCY
    from qkvsearch.spaces import BadInput

    for name in ("concurrency", "trials"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise BadInput(f"--{name}: expected an int >= 1, given {value}")
    if args.seed < 0:  # numpy's generators take none below 0
        raise BadInput(f"--seed: expected an int >= 0, given {args.seed}")
    if args.startup_s is not None and not 0 <= args.startup_s < float("inf"):
        raise BadInput(f"--startup-s: expected a number of seconds >= 0, given {args.startup_s}")
    objectives = sim.parse_objectives(args.objectives) if args.objectives is not None else None
    from qkvsearch.search.simulation import packaged
    from qkvsearch.search.simulation.searchers import parse_constraints

    if packaged.is_packaged(args.source):  # a packaged benchmark's table; output next to the current folder
        curves = packaged.load_packaged(args.source, objectives)
        out = checked_out_dir(args.source.replace(":", "-") + ".parquet", args.out)
    else:
        curves = sim.load_source(args.source, objectives)
        out = checked_out_dir(args.source, args.out)  # before the replays: a refused --out costs nothing
    settings = sim.parse_settings(args.schedulers, curves)
    constraints = parse_constraints(args.constraints, curves)
    runs = sim.compare(curves, settings, concurrency=args.concurrency, startup_s=args.startup_s,
                       seed=args.seed, num_trials=args.trials, searchers=args.searcher, constraints=constraints)
    startup = curves.startup_s if args.startup_s is None else args.startup_s
    print(f"{args.source}: {len(curves)} curves, {curves.max_t} planned epochs, objectives "
          f"{', '.join(f'{d} {m}' for m, d in curves.objectives)}; full grid: {curves.grid_epochs} epochs, "
          f"hypervolume {curves.grid_hv:.4g}\n{args.concurrency or curves.concurrency or DEFAULT_CONCURRENCY} "
          f"trial(s) at a time, {startup:.3g} s start-up each, seed {args.seed}; HV@x%: the completed front's "
          f"hypervolume / the full grid's once x% of its epochs were spent\n")
    print(sim.format_table(curves, runs))
    if constraints:
        print("infeasible proposals (no trial slot): " + ", ".join(f"{r.label} {r.infeasible_share:.0%}" for r in runs))
    for kind, path in sim.write_outputs(curves, runs, out).items():
        print(f"{kind}: {path}")
    return EXIT_OK


_COMMANDS = {"launch": cmd_launch, "resume": cmd_resume, "validate": cmd_validate, "cost": cmd_cost,
             "status": cmd_status, "watch": cmd_watch, "report": cmd_report, "simulate": cmd_simulate,
             "grafana-dashboard": cmd_grafana_dashboard, "export": cmd_export}

if __name__ == "__main__":
    sys.exit(main())
