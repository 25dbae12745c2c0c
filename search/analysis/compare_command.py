"""`qkvsearch compare DIR DIR...`: its arguments and what it runs (search.analysis.compare), apart from
search.cli so that building the command line loads nothing more than argparse."""
from __future__ import annotations


def add_compare_parser(sub) -> None:
    compare = sub.add_parser(
        "compare", help="one report of several campaigns: fronts overlaid, hypervolume, dominance, compute spent",
        description="Put campaigns side by side (search.analysis.compare): their fronts overlaid, each one's "
                    "hypervolume under one common reference, where each front dominates the others, and the compute "
                    "each spent. Campaigns of different objectives or data are refused, naming what differs (exit "
                    "2), unless --shared. Example: qkvsearch compare results/oneshot-digits results/standalone")
    compare.add_argument("dirs", metavar="DIR", nargs="+", help="two campaign folders or more")
    compare.add_argument("--out", metavar="OUT", default=None,
                         help="output folder (default: compare-<name>-<name>... beside the first DIR)")
    compare.add_argument("--shared", action="store_true",
                         help="compare on the objectives the campaigns share, across different data")
    compare.set_defaults(run=cmd_compare)


def cmd_compare(args) -> int:
    from qkvsearch.search.analysis.compare import write_comparison

    for kind, path in write_comparison(args.dirs, out=args.out, shared=args.shared).items():
        print(f"{kind}: {path}")
    return 0
