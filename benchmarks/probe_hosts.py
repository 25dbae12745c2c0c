"""Probe every timm entrypoint for q/k/v sites and each embedding, and write the coverage page of the docs.

    .venv/bin/python benchmarks/probe_hosts.py                 # every entrypoint, all CPU cores (~1 h on 2 cores)
    .venv/bin/python benchmarks/probe_hosts.py --only 'swin*'  # some, printed (the page is not rewritten)

Each entrypoint is probed by trainers.model.coverage.probe in a pool of processes, on the meta device:
timm's model is built and scanned for q/k/v sites; a model with neither a site nor attention the embedding
cannot take is out of scope. For each embedding, ``model_cost`` and ``build_model`` of ``{"model": name,
"embedding": e, "num_classes": 10}`` run as a user runs them and the built model's forward is counted: built (and
whether the counts agree), refused by name (a ConfigError) or crashed. The rows go to build/hosts-probe.jsonl as
they come (``--resume`` keeps those of a run cut short), then to docs/pages/hosts-coverage.json and the page
docs/pages/hosts-coverage.md. tests/trainers/test_hosts.py probes one entrypoint of each family and checks the
page agrees.
"""
from __future__ import annotations

import argparse
import collections
import fnmatch
import json
import multiprocessing
import os
import re
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
JSONL = REPO / "build" / "hosts-probe.jsonl"
TABLE = REPO / "docs" / "pages" / "hosts-coverage.json"
PAGE = REPO / "docs" / "pages" / "hosts-coverage.md"
LIMIT_S = 900   # one entrypoint, all embeddings


class _Late(Exception):
    pass


def _alarm(*_):
    raise _Late


def _probe(name: str) -> dict:
    from qkvsearch.trainers.model.coverage import probe

    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(LIMIT_S)
    start = time.perf_counter()
    try:
        row = probe(name)
    except _Late:
        row = {"model": name, "module": "?", "timed_out": LIMIT_S}
    finally:
        signal.alarm(0)
    return {**row, "seconds": round(time.perf_counter() - start, 2)}


def entrypoints() -> list[str]:
    """timm's own entrypoints (the qkv_* and other models qkvsearch registers left out)."""
    import timm
    from timm.models import model_entrypoint

    import qkvsearch.trainers.model.registry  # noqa: F401  (registers ours, to leave them out)

    return [n for n in timm.list_models() if model_entrypoint(n).__module__.startswith("timm.")]


def run(names: list[str], workers: int, done: dict) -> dict:
    todo = [n for n in names if n not in done]
    JSONL.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(JSONL, "a") as out, multiprocessing.get_context("spawn").Pool(workers, maxtasksperchild=25) as pool:
        for i, row in enumerate(pool.imap_unordered(_probe, todo), 1):
            done[row["model"]] = row
            out.write(json.dumps(row) + "\n")
            out.flush()
            marks = " ".join(f"{e}:{row[e]['status'][0]}" for e in ("linear", "sne", "psne", "fsne") if e in row)
            print(f"[{i}/{len(todo)} {time.perf_counter() - start:6.0f}s] {row['model']:50s} "
                  f"{row.get('scope', marks)}", flush=True)
    return done


# ---------------------------------------------------------------------------------------------- the page


def summary(rows: list[dict], total: int) -> dict:
    """``total``: timm's entrypoints; ``rows``: those scanned so far (all of them once a run has ended)."""
    from qkvsearch.spaces.keys import EMBEDDINGS

    probed = [r for r in rows if "scope" not in r]
    out = {"entrypoints": total, "scanned": len(rows), "probed": len(probed),
           "timed_out": sum(1 for r in rows if "timed_out" in r)}
    for e in EMBEDDINGS:
        status = collections.Counter(r[e]["status"] for r in probed if e in r)
        out[e] = dict(status)
    out["crashed"] = sum(1 for r in probed for e in EMBEDDINGS if r.get(e, {}).get("status") == "crashed")
    out["counts_differ"] = sum(1 for r in probed for e in EMBEDDINGS if r.get(e, {}).get("counts_equal") is False)
    return out


def _why(text: str) -> str:
    """A refusal's reason without the model's name, the site's path or the count of others like it, so that a
    module's entrypoints share it."""
    reason = text.split(" (", 1)[1].rsplit("), given", 1)[0] if " (" in text else text
    reason = re.sub(r"; and \d+ more$", "", re.sub(r"^at [\w.]+, ", "", reason))
    return reason.replace("|", "\\|")


def _mark(cell: dict | None) -> str:
    if cell is None:
        return ""
    if cell["status"] == "built":
        return "built" if cell["counts_equal"] else "built, counts differ"
    return cell["status"]


def render(rows: list[dict], versions: dict, total: int) -> str:
    from qkvsearch.spaces.keys import EMBEDDINGS

    s = summary(rows, total)
    probed = sorted((r for r in rows if "scope" not in r), key=lambda r: (r["module"], r["model"]))
    lines = [
        "# Hosts: coverage of timm's entrypoints",
        "",
        "Generated by `benchmarks/probe_hosts.py` (do not edit): every timm entrypoint built on the meta device and "
        "scanned for q/k/v sites (the [hosts](hosts.md) page says what a site is); each one with a site, or with "
        "attention the embedding cannot take, probed with each embedding as `{\"model\": NAME, \"embedding\": E, "
        "\"num_classes\": 10}` through `model_cost` and `build_model`, and the built model's forward counted by "
        "torch's flop counter. `tests/trainers/test_hosts.py` probes one entrypoint of each family and checks this "
        "page agrees. The rows: `hosts-coverage.json` beside this page.",
        "",
        f"Probed with timm {versions['timm']} and torch {versions['torch']}.",
        "",
        "| | entrypoints |",
        "|---|---:|",
        f"| timm entrypoints | {s['entrypoints']} |",
        f"| scanned for q/k/v sites | {s['scanned']} |",
        *([f"| not scanned yet (`--resume` goes on) | {s['entrypoints'] - s['scanned']} |"]
          if s["scanned"] < s["entrypoints"] else []),
        f"| with q/k/v attention: probed | {s['probed']} |",
    ]
    for e in EMBEDDINGS:
        lines.append(f"| {e}: built / refused by name / crashed | {s[e].get('built', 0)} / {s[e].get('refused', 0)} "
                     f"/ {s[e].get('crashed', 0)} |")
    lines += [f"| crashed (any embedding) | {s['crashed']} |",
              f"| built, but model_cost's counts differ from the built model's | {s['counts_differ']} |",
              f"| timed out | {s['timed_out']} |", "",
              "## By timm module", "",
              "| module | probed | " + " | ".join(EMBEDDINGS) + " | sites | refused: why |",
              "|---|---:|" + "---:|" * len(EMBEDDINGS) + "---|---|"]
    by_module = collections.defaultdict(list)
    for r in probed:
        by_module[r["module"]].append(r)
    for module, group in sorted(by_module.items()):
        built = [sum(1 for r in group if r.get(e, {}).get("status") == "built") for e in EMBEDDINGS]
        adapters = sorted({a for r in group for a in r.get("adapters", ())})
        whys = sorted({_why(r[e]["why"]) for r in group for e in EMBEDDINGS if r.get(e, {}).get("status") == "refused"})
        lines.append(f"| {module} | {len(group)} | " + " | ".join(map(str, built)) + f" | {'; '.join(adapters)} | "
                     + "<br>".join(whys) + " |")
    lines += ["", "## Every entrypoint probed", "",
              "| entrypoint | module | " + " | ".join(EMBEDDINGS) + " |",
              "|---|---|" + "---|" * len(EMBEDDINGS)]
    for r in probed:
        lines.append(f"| {r['model']} | {r['module']} | " + " | ".join(_mark(r.get(e)) for e in EMBEDDINGS) + " |")
    out_of_scope = collections.Counter(r["module"] for r in rows if "scope" in r)
    lines += ["", "## Out of scope", "",
              "Entrypoints with no q/k/v attention (convolutional networks, MLPs, modulation and pooling mixers), by "
              "timm module: " + ", ".join(f"{m} ({n})" for m, n in sorted(out_of_scope.items())) + ".", ""]
    return "\n".join(lines)


def write(rows: list[dict], total: int) -> None:
    import timm
    import torch

    versions = {"timm": timm.__version__, "torch": torch.__version__.split("+")[0]}
    rows = sorted(rows, key=lambda r: r["model"])
    head = json.dumps({"versions": versions, "summary": summary(rows, total)})[:-1]  # a row a line: diffs stay readable
    TABLE.write_text(head + ', "rows": [\n' + ",\n".join(json.dumps(r) for r in rows) + "\n]}\n")
    PAGE.write_text(render(rows, versions, total))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="fnmatch pattern of entrypoints (printed; the page is not rewritten)")
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--resume", action="store_true", help="keep the rows of build/hosts-probe.jsonl")
    parser.add_argument("--page", action="store_true", help="with --resume: write the page of the rows so far "
                        "(it says how many entrypoints are left), probing none")
    args = parser.parse_args(argv)
    names = entrypoints()
    if args.only:
        names = [n for n in names if fnmatch.fnmatch(n, args.only)]
        rows = run(names, args.workers, {})
        print(json.dumps(summary(list(rows.values()), len(names)), indent=1))
        return 0
    done = {}
    if args.resume and JSONL.exists():
        done = {r["model"]: r for r in map(json.loads, JSONL.read_text().splitlines()) if r["model"] in names}
    elif JSONL.exists():
        JSONL.unlink()
    if args.page:   # the page of the rows so far, saying how many are left
        rows = done
    else:
        rows = run(names, args.workers, done)
    write([rows[n] for n in names if n in rows], len(names))
    print(json.dumps(summary(list(rows.values()), len(names)), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
