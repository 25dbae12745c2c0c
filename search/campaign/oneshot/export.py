"""`qkvsearch export`: one subnet of a one-shot campaign's trained supernet as a stand-alone checkpoint.

    <folder>/exports/<name>.pt    {"model": the state dict build_model(config) loads (CPU, full precision, BatchNorm
                                   recalibrated), "config", "supernet": its identity, "quantized": that model's state
                                   dict under the config's quantization policy (with a policy only; torchao tensors)}
    <folder>/exports/<name>.json  {"subnet_id" (a scored one's), "keys", "config", "supernet", "counted": its counted
                                   cost, "measured": the cost its evaluation did not count (measured on "measured_on";
                                   "predicted" names those predicted), "inherited": its scores}

folder: the campaign's, or a deployment target's (search.records.inherited.target_dir); name: the subnet's id where it
was scored, else a digest of its space keys (``out``: the checkpoint's path instead). The subnet: the k-th chosen of the
folder's selection (``rank``), a scored one by its id (``subnet``), or its space keys (``sets``, KEY=VALUE: each key the
space searches, any value the supernet holds; those it fixes keep their value). The supernet (the campaign's, or
``supernet.from``'s) is loaded once, in this process, on the CPU (trainers.supernet.scoring.SubnetScorer).
"""
from __future__ import annotations

import hashlib
import io
import posixpath

import pyarrow.fs as pafs
import yaml

from qkvsearch.search.campaign.oneshot.plan import PLAN_FILE
from qkvsearch.search.records import inherited
from qkvsearch.search.records.layout import CAMPAIGN_FILE, open_campaign
from qkvsearch.search.records.outputs import EXPORTS_DIR, check_output_dir
from qkvsearch.spaces import base_config
from qkvsearch.spaces.errors import BadInput, show
from qkvsearch.spaces.keys import quant_policy
from qkvsearch.spaces.metrics import COUNTED_METRICS
from qkvsearch.storage import exists, open_location, read_json, write_bytes, write_json


def add_export_parser(sub) -> None:
    """The `export` command's arguments (search.cli)."""
    text = "write a subnet of a one-shot campaign's supernet as a stand-alone checkpoint, and its costs and scores"
    cmd = sub.add_parser("export", help=text, description=text)
    cmd.add_argument("dir", metavar="DIR", help="the one-shot campaign's folder")
    cmd.add_argument("--target", metavar="NAME", default=None, help="a deployment target's selection and scores")
    which = cmd.add_mutually_exclusive_group(required=True)
    which.add_argument("--rank", type=int, metavar="K", help="the K-th chosen subnet of the selection (from 1)")
    which.add_argument("--subnet", metavar="ID", help="a scored subnet, by its id (subnet_000012)")
    which.add_argument("--set", dest="sets", action="append", metavar="KEY=VALUE",
                       help="a space key's value, one per key it searches")
    cmd.add_argument("--out", metavar="PATH", default=None,
                     help="the checkpoint's path, outside the campaign's records (default DIR/exports/NAME.pt); its "
                          "summary is written beside it as the same name with .json")
    cmd.add_argument("--force", action="store_true", help="replace a checkpoint or summary already at those paths")


def cmd_export(args) -> int:
    for kind, path in export_subnet(args.dir, target=args.target, rank=args.rank, subnet=args.subnet,
                                    sets=args.sets or (), out=args.out, force=args.force).items():
        print(f"{kind}: {path}")
    return 0


def export_subnet(exp: str, *, target=None, rank=None, subnet=None, sets=(), out=None, force=False) -> dict[str, str]:
    """Write the subnet (module docstring); -> {"checkpoint": its path, "summary": the JSON's}. BadInput naming
    what cannot be exported, before anything is written: a file already at either path too, unless ``force``."""
    from qkvsearch.search.searchers.problem import build_trial

    if sum(x is not None for x in (rank, subnet, sets or None)) != 1:
        raise BadInput("export: expected one of --rank, --subnet, --set")
    exp = str(exp).rstrip("/")
    oneshot = spec = open_campaign(exp, validate=True).spec
    if not oneshot.supernet:
        raise BadInput(f"{exp}: expected a one-shot campaign (with a supernet section), given one without")
    folder = _folder(exp, oneshot, target)
    if target is not None and exists(f"{folder}/{CAMPAIGN_FILE}"):
        spec = open_campaign(folder, validate=True).spec   # a target searches its own space
    keys, record = _named(folder, spec, rank, subnet, sets)
    trial = record or build_trial(base_config(spec), keys)
    shown = ", ".join(f"{k}={v}" for k, v in keys.items())
    if trial.get("invalid"):
        raise BadInput(f"--set: expected keys a model can be made of, given {shown}: {trial['invalid']}")
    config, ident = trial["config"], inherited.subnet_identity(trial["config"])
    record = record or next((e for e in inherited.read_evaluations(folder)
                             if inherited.subnet_identity(e["config"]) == ident), None)
    name = record["subnet_id"] if record else hashlib.sha256(inherited.keys_text(keys).encode()).hexdigest()[:12]
    pt, summary = _paths(exp, folder, name, out, force)

    import torch

    from qkvsearch.search.campaign.oneshot.phases import _trained
    from qkvsearch.trainers.supernet.plan import SupernetPlan
    from qkvsearch.trainers.supernet.scoring import SubnetScorer
    from qkvsearch.trainers.training.engine import load_state

    supernet_dir = f"{oneshot.supernet.source or exp}/{inherited.SUPERNET_DIR}"
    checkpoint, teacher_cfg, supernet_id = _trained(supernet_dir)
    plan = SupernetPlan.from_dict(read_json(f"{supernet_dir}/{PLAN_FILE}"))
    why = plan.supernet(init=False).serves(config)
    if why:
        raise BadInput(f"expected a subnet the supernet {supernet_id} holds, given "
                       f"{record['subnet_id'] + ' ' if record else ''}({shown}), which it cannot run: {why}")
    scorer = SubnetScorer(plan, load_state(checkpoint), teacher_cfg, oneshot.supernet.bn_batches, device="cpu")
    weights = {k: v.cpu() for k, v in scorer.extract(config).items()}
    buf = io.BytesIO()
    torch.save({"model": weights, "config": config, "supernet": supernet_id, **_quantized(config, weights)}, buf)
    write_bytes(pt, buf.getvalue())
    write_json(summary, _summary(keys, config, supernet_id, trial["cost"], record))
    return {"checkpoint": pt, "summary": summary}


def _folder(exp: str, spec, target: str | None) -> str:
    """The folder whose selection and evaluations are read: the campaign's, or one of its targets'."""
    names = [t.name for t in spec.targets]
    if (target is None) != (not names) or (target is not None and target not in names):
        raise BadInput("--target: expected one of the campaign's deployment targets "
                       f"({', '.join(names) or 'it has none'})"
                       + (", where each has its own subnets" if target is None else "") + f", given {show(target)}")
    return inherited.target_dir(exp, target)


def _named(folder: str, spec, rank, subnet, sets) -> tuple[dict, dict | None]:
    """(space keys, the evaluation when one was recorded) of the subnet the command names."""
    evaluations = inherited.read_evaluations(folder)
    if subnet is not None:
        found = next((e for e in evaluations if e.get("subnet_id") == subnet), None)
        if found is None:
            ids = [str(e.get("subnet_id")) for e in evaluations]
            raise BadInput(f"--subnet: expected the id of a subnet scored in {folder} ({len(ids)} scored: "
                           f"{', '.join(ids[:5]) + (', ...' if len(ids) > 5 else '') or 'none'}), given {show(subnet)}")
        return dict(found["keys"]), found
    if rank is not None:
        chosen = (inherited.read_selection(folder) or {}).get("chosen", [])
        if not 1 <= rank <= len(chosen):
            raise BadInput(f"--rank: expected a rank from 1 to the number of chosen subnets ({len(chosen)} in "
                           f"{folder}), given {rank}")
        keys = dict(chosen[rank - 1])
        return keys, next((e for e in evaluations if inherited.keys_text(e["keys"]) == inherited.keys_text(keys)), None)
    return _set_keys(spec.space, sets), None


def _set_keys(space, sets) -> dict:
    """--set KEY=VALUE (values as YAML scalars) over the keys the space fixes; each key it searches named."""
    given = {}
    for item in sets:
        key, eq, text = str(item).partition("=")
        if not eq or key.strip() not in space.keys:
            raise BadInput(f"--set: expected KEY=VALUE with a key of the campaign's space ({', '.join(space.keys)}), "
                           f"given {show(item)}")
        given[key.strip()] = yaml.safe_load(text) if text.strip() else None
    keys = dict(space.variants[0]) if len(space.variants) == 1 else {}
    for dim in space.dimensions:
        if not dim.active({**keys, **given}):
            if dim.key in given:
                raise BadInput(f"--set {dim.key}: expected no value, as it applies only with " + ", ".join(
                    f"{k} {' or '.join(map(str, v))}" for k, v in dim.when.items()))
        elif dim.key not in given and dim.enumerable and len(dim.values) == 1:
            keys[dim.key] = dim.values[0]
        elif dim.key not in given:
            shown = " | ".join(map(str, dim.values)) if dim.enumerable else f"{dim.low} to {dim.high}"
            raise BadInput(f"--set: expected a value for each key the space searches; none for {dim.key} ({shown})")
    return {**keys, **given}


def _paths(exp: str, folder: str, name: str, out: str | None, force: bool) -> tuple[str, str]:
    """(the checkpoint's path, the summary's): ``out`` checked as a file in a folder one may write into
    (search.records.outputs: outside the campaign's records), its summary another file; neither there already
    unless ``force``."""
    if out is None:
        pt, summary = f"{folder}/{EXPORTS_DIR}/{name}.pt", f"{folder}/{EXPORTS_DIR}/{name}.json"
    else:
        pt = str(out)
        if pt.endswith("/") or _is_folder(pt):
            raise BadInput(f"--out: expected a file's path, given {show(pt)}, which is a folder")
        check_output_dir(posixpath.dirname(pt) or ".", "--out", campaign=exp)
        stem, ext = posixpath.splitext(pt)
        summary = f"{stem if ext else pt}.json"
        if summary == pt:
            raise BadInput(f"--out: expected a checkpoint's path not ending in .json (its summary is written beside "
                           f"it as <name>.json), given {show(pt)}")
    for kind, path in () if force else (("checkpoint", pt), ("summary", summary)):
        if exists(path) and out is not None:
            raise BadInput(f"--out: expected a path where no file is, given {show(out)}, whose {kind} {path} exists "
                           "(an earlier export, or a file of yours); --force replaces it")
        if exists(path):
            raise BadInput(f"{path}: expected no file where the export writes its {kind}, given an earlier export "
                           "of this subnet; --force replaces it, --out writes elsewhere")
    return pt, summary


def _is_folder(path: str) -> bool:
    fs, where = open_location(path)
    return fs.get_file_info(where).type == pafs.FileType.Directory


def _quantized(config: dict, weights: dict) -> dict:
    """{"quantized": the exported model's state dict under the config's quantization policy} ({} without one)."""
    if not quant_policy(config):
        return {}
    from qkvsearch.trainers.model.models import build_model
    from qkvsearch.trainers.model.quantize import quantize_model

    model = build_model(config)
    model.load_state_dict(weights)
    return {"quantized": quantize_model(model.eval(), config, "cpu").state_dict()}


def _summary(keys: dict, config: dict, supernet_id: str, cost: dict, record: dict | None) -> dict:
    out = {"keys": keys, "config": config, "supernet": supernet_id, "counted": {
        k: v for k, v in cost.items() if k in COUNTED_METRICS}}
    return out if record is None else {"subnet_id": record["subnet_id"], **out,
            "measured": {k: v for k, v in record["cost"].items() if k not in COUNTED_METRICS},
            **({"measured_on": record["measured_on"]} if record.get("measured_on") else {}),
            "predicted": list(record.get("predicted") or []),
            **({"inherited": record["metrics"]} if record.get("metrics") else {})}

