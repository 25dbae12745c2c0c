"""A campaign's results in the layout of the SNE paper's tables, as Markdown, LaTeX and CSV, with the paper's own
figures beside where the campaign trains the paper's setting (``paper_setting``: ImageNet-1k at 224 px on one of
its XCiT sizes).

    one row per design: the eligible trials with a finite accuracy grouped by training identity without the seed
    (spaces.keys.identity), in the paper's order (linear, SNE, P-SNE, F-SNE; then width, code size)
      design, embedding, width (the solved hidden width), code size and sharing (F-SNE), the other searched keys
      that vary over the rows; params (M), GMACs; the accuracy objective's mean and sample standard deviation
      over the design's seeds, and how many
      vs linear: the mean's difference to its baseline, the linear design that agrees with it on every key outside
      the embedding's (the same model, data and recipe), with a Welch 95 % t interval (both sides need 2 seeds)
      paper: the paper's params, GMACs and top-1 of the same design (results/reference/sne_paper_imagenet.csv:
      embedding, code size, param-matched width ``match``, or the paper's Table 1 width; shared codes), and its
      difference to the paper's XCiT
"""
from __future__ import annotations

import html
import io
import json
import math
from importlib import resources

import numpy as np
import pandas as pd

from qkvsearch.search.analysis.effects import accuracy_objective
from qkvsearch.spaces.choices import EMBEDDING_CHOICES
from qkvsearch.spaces.keys import KEYS, RESOLVED_KEYS, identity, names

PAPER_CSV = resources.files("qkvsearch.reference") / "sne_paper_imagenet.csv"   # package data
PAPER_SIZES = {"xcit_nano_12": "S", "xcit_tiny_12": "M", "xcit_small_12": "L"}
PAPER_DIMS = {"S": 128, "M": 192, "L": 384}   # the token dim d of each size (XCiT-N12, -T12, -S12)
PAPER_LABELS = {"linear": "linear (baseline)", "sne": "SNE", "psne": "P-SNE", "fsne": "F-SNE"}
BASELINE = "linear"
LEVEL = 0.95
# the keys a row names besides the searched ones (the paper's columns), and those a baseline may differ in
DESIGN_COLUMNS = ("embedding", "width", "code_size", "code_sharing")
EMBEDDING_KEYS = (*names("embedding"), "width")
TABLE_TITLE = "Results in the paper's layout"


# ---------------------------------------------------------------------------------------- the paper's figures
def _first(df: pd.DataFrame, col: str):
    vals = df[col].dropna().unique() if col in df else []
    return vals[0] if len(vals) == 1 else None


def paper_setting(trials: pd.DataFrame) -> str | None:
    """Paper size S/M/L when every trial trains the paper's ImageNet setting (an imagefolder dataset of
    1000 classes at 224 px, on an XCiT of one of the paper's sizes), else None."""
    dataset, classes = _first(trials, "config_dataset"), _first(trials, "config_num_classes")
    img, model = _first(trials, "config_img_size"), _first(trials, "config_model")
    if dataset != "imagefolder" or classes != 1000 or img != 224 or not isinstance(model, str):
        return None
    for prefix, size in PAPER_SIZES.items():
        if model.startswith(prefix):
            return size
    return None


def paper_points(size: str, csv_path=None) -> pd.DataFrame:
    """The paper's rows of one size, labelled ("paper F-SNE-C8*-S"), gmacs as reported."""
    ref = pd.read_csv(csv_path or PAPER_CSV, comment="#")
    ref = ref[ref["size"] == size].copy()
    code = ref["code_size"].map(lambda c: "" if pd.isna(c) else f"-C{int(c)}")
    star = np.where(_matched(ref), "*", "")
    ref["label"] = "paper " + ref["embedding"].str.upper().str.replace("FSNE", "F-SNE").str.replace(
        "PSNE", "P-SNE") + code + star + f"-{size}"
    return ref.rename(columns={"gmacs_reported": "gmacs"})


def _matched(ref: pd.DataFrame) -> np.ndarray:
    return (ref["param_matched"].astype(str).str.lower() == "true").to_numpy()


def _paper_row(config: dict, paper: pd.DataFrame, size: str) -> pd.Series | None:
    """The paper's row of the same design (module docstring), or None."""
    emb = config.get("embedding")
    rows = paper[paper["embedding"] == emb]
    if emb != BASELINE:
        requested, choice = config.get("hidden_width"), EMBEDDING_CHOICES.get(emb)
        if choice is None or config.get("code_sharing") not in (None, "shared"):
            return None
        matched = requested == "match"
        paper_width = requested == "paper" or (isinstance(requested, float) and requested == choice.paper_width) \
            or (isinstance(requested, int) and requested == round(choice.paper_width * PAPER_DIMS[size]))
        if not (matched or paper_width):
            return None
        rows = rows[_matched(rows) == matched]
        if choice.codes:
            rows = rows[rows["code_size"] == config.get("code_size")]
    return rows.iloc[0] if len(rows) else None


# ---------------------------------------------------------------------------------------- the table
def _label(config: dict) -> str:
    emb = str(config.get("embedding"))
    label = PAPER_LABELS.get(emb, emb)
    if EMBEDDING_CHOICES.get(emb) and EMBEDDING_CHOICES[emb].codes:
        label += f"-C{config.get('code_size')}" + ("*" if config.get("hidden_width") == "match" else "")
        if config.get("code_sharing") == "per_block":
            label += " (codes per block)"
    if EMBEDDING_CHOICES.get(emb) and EMBEDDING_CHOICES[emb].hidden:
        label += f" h={config.get('width')}"
    return label


def welch_interval(a, b, level: float = LEVEL) -> tuple[float, float] | None:
    """mean(a) - mean(b)'s Welch t interval (unequal variances); None unless each side has 2 values."""
    from scipy.stats import t

    a, b = np.asarray(a, float), np.asarray(b, float)
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    diff, se = a.mean() - b.mean(), math.sqrt(va + vb)
    if se == 0:
        return (float(diff), float(diff))
    dof = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = float(t.ppf(0.5 + level / 2, dof)) * se
    return (float(diff - half), float(diff + half))


def paper_table(info, space_keys=(), paper_csv=None) -> pd.DataFrame:
    """The table (module docstring) of a campaign's trials. info: search.analysis.front.FrontInfo; space_keys: the
    campaign's searched keys. Columns: design, the design and searched keys, params_m, gmacs, <metric> (the mean),
    sd, seeds, vs linear, ci low, ci high, then paper params_m, paper gmacs, paper <metric>, paper vs linear where
    the setting is the paper's."""
    i = accuracy_objective(info.metrics, info.directions)
    if i is None:
        return pd.DataFrame()
    metric, col, df = info.metrics[i], info.columns[i], info.trials
    ok = df["eligible"].to_numpy() & np.isfinite(df[col].to_numpy(dtype="float64", na_value=np.nan))
    pool = df.loc[ok, ["config_json", col, *[c for c in ("params_m", "gmacs") if c in df]]]
    groups: dict[str, dict] = {}
    for text, value, *cost in pool.itertuples(index=False):
        config = json.loads(text)
        g = groups.setdefault(identity(config, ignore=("seed",)), {"config": config, "values": [], "cost": cost})
        g["values"].append(float(value))
    frames = {k: identity(g["config"], ignore=("seed", *EMBEDDING_KEYS)) for k, g in groups.items()}
    baselines = {frames[k]: g for k, g in groups.items() if g["config"].get("embedding") == BASELINE}
    size = paper_setting(df)
    paper = paper_points(size, paper_csv) if size else None
    paper_base = _paper_row({"embedding": BASELINE}, paper, size) if size else None
    # the paper's columns, the searched keys, then any other key that tells two designs apart (not the seed)
    told = [k for k in KEYS if k != "seed" and len({json.dumps(g["config"].get(k)) for g in groups.values()}) > 1]
    keys = [k for k in dict.fromkeys([*DESIGN_COLUMNS, *space_keys, *told]) if k in KEYS or k == "width"]
    rows = []
    for k, g in groups.items():
        config, values = g["config"], np.array(g["values"])
        row = {"design": _label(config), **{key: config.get(key) for key in keys}}
        row |= dict(zip([c for c in ("params_m", "gmacs") if c in df], g["cost"]))
        row |= {metric: values.mean(), "sd": values.std(ddof=1) if len(values) > 1 else np.nan, "seeds": len(values)}
        base = baselines.get(frames[k])
        diff = ci = None
        if base is not None and config.get("embedding") != BASELINE:
            diff = values.mean() - np.mean(base["values"])
            ci = welch_interval(values, base["values"])
        row |= {"vs linear": diff, "ci low": ci[0] if ci else None, "ci high": ci[1] if ci else None}
        if paper is not None:
            ref = _paper_row(config, paper, size)
            row |= {"paper params_m": None if ref is None else ref["params_m"],
                    "paper gmacs": None if ref is None else ref["gmacs"],
                    f"paper {metric}": None if ref is None else ref["top1"],
                    "paper vs linear": None if ref is None or paper_base is None or config.get("embedding") == BASELINE
                    else ref["top1"] - paper_base["top1"]}
        rows.append(row)
    out = pd.DataFrame(rows)
    if not len(out):
        return out
    order = {e: n for n, e in enumerate(EMBEDDING_CHOICES)}
    out["_order"] = out["embedding"].map(lambda e: order.get(e, len(order)))
    sort = ["_order"] + [c for c in ("width", "code_size", "code_sharing", *space_keys) if c in out]
    out = out.sort_values(sort, kind="stable", key=lambda s: s.astype(str) if s.dtype == object else s)
    out = out.drop(columns="_order").reset_index(drop=True)
    empty = [c for c in keys if out[c].isna().all() and c != "embedding"]
    constant = [c for c in keys if c not in DESIGN_COLUMNS and out[c].astype(str).nunique() < 2]
    return out.drop(columns=list(dict.fromkeys(empty + constant)))


# ---------------------------------------------------------------------------------------- formats
def _num(v, fmt: str) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def _text(v, key: str = "") -> str:
    declared = RESOLVED_KEYS.get(key)
    if isinstance(v, float) and v.is_integer() and declared is not None and declared.arrow == "int64":
        return str(int(v))   # an int column with a gap reads back as floats
    return "" if _missing(v) else str(v)


def _shown(table: pd.DataFrame, metric: str) -> tuple[list[str], list[list[str]]]:
    """(headings, rows of text): the mean with its sd, the difference with its interval, the paper's beside."""
    keys = [c for c in table.columns if c not in _FIGURES and c != metric and not c.startswith("paper ")]
    head = [*keys, "params (M)", "GMACs", f"{metric} (mean ± sd, seeds)", "vs linear (95 % CI)"]
    paper = f"paper {metric}" in table
    if paper:
        head += ["paper params (M)", "paper GMACs", f"paper {metric}", "paper vs linear"]
    out = []
    for r in table.to_dict("records"):
        spread = f" ± {r['sd']:.2f}" if not _missing(r["sd"]) else ""
        ci = f" ({r['ci low']:+.2f} to {r['ci high']:+.2f})" if not _missing(r["ci low"]) else ""
        cells = [_text(r[k], k) for k in keys] + [_num(r.get("params_m"), ".3g"), _num(r.get("gmacs"), ".3g"),
                                                f"{r[metric]:.2f}{spread} ({r['seeds']})",
                                                _num(r["vs linear"], "+.2f") + ci]
        if paper:
            cells += [_num(r["paper params_m"], ".3g"), _num(r["paper gmacs"], ".3g"),
                      _num(r[f"paper {metric}"], ".1f"), _num(r["paper vs linear"], "+.1f")]
        out.append(cells)
    return head, out


_FIGURES = ("params_m", "gmacs", "sd", "seeds", "vs linear", "ci low", "ci high")


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


HOW = ("one row per design (its seeds together); vs linear: the difference of the means to the linear design of the "
       "same model, data and recipe, with a Welch 95 % t interval where both have 2 seeds or more")


def table_markdown(table: pd.DataFrame, metric: str, note: str = "") -> str:
    head, rows = _shown(table, metric)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(lines + ["", f"_{HOW}{'; ' + note if note else ''}._"])


def table_html(table: pd.DataFrame, metric: str, note: str = "") -> str:
    head, rows = _shown(table, metric)
    heads = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return (f"<table id=\"paper\"><thead><tr>{heads}</tr></thead><tbody>{body}</tbody></table>"
            f"<p class=\"how\">{html.escape(HOW + ('; ' + note if note else ''))}.</p>")


_LATEX = str.maketrans({"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
                        "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "\\": r"\textbackslash{}"})


def table_latex(table: pd.DataFrame, metric: str) -> str:
    """A booktabs tabular (\\usepackage{booktabs}); ± as $\\pm$."""
    head, rows = _shown(table, metric)

    def cell(text: str) -> str:
        return text.translate(_LATEX).replace("±", r"$\pm$")

    spec = "l" * (len(head) - 4 - (4 if len(head) > 4 and head[-1] == "paper vs linear" else 0))
    spec += "r" * (len(head) - len(spec))
    lines = [rf"\begin{{tabular}}{{{spec}}}", r"\toprule", " & ".join(cell(h) for h in head) + r" \\", r"\midrule"]
    lines += [" & ".join(cell(c) for c in r) + r" \\" for r in rows]
    return "\n".join(lines + [r"\bottomrule", r"\end{tabular}", ""])


def table_csv(table: pd.DataFrame) -> bytes:
    buf = io.StringIO()
    table.to_csv(buf, index=False)
    return buf.getvalue().encode("utf-8")


def paper_note(table: pd.DataFrame, trials: pd.DataFrame) -> str:
    """Why the paper's figures are not beside (empty when they are)."""
    if any(c.startswith("paper ") for c in table.columns):
        return ""
    model, dataset = _first(trials, "config_model"), _first(trials, "config_dataset")
    return (f"the paper's figures are not beside: this campaign trains {model or 'several models'} on "
            f"{dataset or 'several datasets'}, the paper XCiT-N12/T12/S12 on ImageNet-1k at 224 px")
