"""Every key of a trial config, declared once: ``KEYS``.

A trial config is one flat dict of plain values (model, embedding, data and training keys). Each key is a
``Key``: its check (type and allowed values, one of spaces.checks), default, unit, group, the campaign-file
section that sets it, and one line of doc. Everything else derives from this table: the spec loader's section
tables and searchable keys, ``fill`` (defaults and checks), the model and cost configs, the architecture's key
groups, the Parquet column types, the report's tables and search/RESULTS_SCHEMA.md (as the site shows it)."""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from qkvsearch.spaces.blocks import PER_BLOCK_KEYS, block_keys, block_values, check_blocks, split_block_key
from qkvsearch.spaces.checks import (
    AUTO_AUGMENT,
    AUTO_FLAG,
    FLAG,
    FRACTION,
    HIDDEN_WIDTH,
    MAX_BLOCKS,
    MAX_MLP_RATIO,
    MAX_PIXELS,
    MAX_UNITS,
    MODEL_NAME,
    NONNEG_INT,
    NONNEG_NUM,
    OPTIMIZER,
    PAPER_WIDTH,
    POS_INT,
    POS_NUM,
    REGISTERED_PREFIX,
    SEED,
    TEXT,
    WORKERS,
    Bad,
    Check,
    integer,
    number,
    one_of,
)
from qkvsearch.spaces.choices import (
    ATTENTION_CHOICES,
    EMBEDDING_CHOICES,
    FAMILIES,
    FULL_PRECISION,
    KEY_CHOICES,
    MIXER,
    POSITION_CHOICES,
    PRECISION_CHOICES,
    QUANT_PARTS,
    STEM_CHOICES,
    VIT,
    XCIT,
    embeddings_with,
    sized_by,
    unmet_need,
)
from qkvsearch.spaces.choices import model_family as _family
from qkvsearch.spaces.datasets import (
    BAD_IMAGE_POLICIES,
    DATASET_INFO,
    DATASETS,
    MAX_CLASSES,
    PIPELINES,
    fill_from_dataset,
)
from qkvsearch.spaces.errors import ConfigError, config_error, hint, show  # noqa: F401  (show: read here too)
from qkvsearch.spaces.policy import QUANT_KEYS, full_precision, is_policy_key, quant_policy  # noqa: F401

EMBEDDINGS = tuple(EMBEDDING_CHOICES)  # the choice keys' values: spaces.choices, one table each
ACTIVATIONS = ("relu", "gelu")          # the embedding's sigma (trainers.model.embeddings.make_activation)
LR_SCHEDULES = ("cosine", "tanh", "step", "multistep", "poly", "wsd", "rsqrt", "constant", "none")
ATTENTIONS = tuple(ATTENTION_CHOICES)
POS_EMBEDS = tuple(POSITION_CHOICES)
PATCH_EMBEDS = tuple(STEM_CHOICES)
KEY_KINDS = tuple(KEY_CHOICES)
KEY_AGGREGATIONS = ("vanilla", "simple", "spatial", "kua")
PRECISIONS = tuple(PRECISION_CHOICES)
ATTENTION_SIZE_KEY = {n: c.size_key for n, c in ATTENTION_CHOICES.items() if c.size_key}  # of those with one
QKV_ATTENTIONS = tuple(n for n, c in ATTENTION_CHOICES.items() if c.projects_qkv)   # those with q/k/v projections


# ---------------------------------------------------------------------------------------------- the keys

GROUPS = ("model", "embedding", "quant", "data", "train")
MODEL_GROUPS = ("model", "embedding")   # the keys that decide the model, hence its cost
# quant: the quantization policy, applied after training (trainers.model.quantize): it decides the deployed model's
# precision, hence its measured cost, size and top1_q, but neither the training nor the counted params and MACs.
DEFAULT = "<the default>"   # Key.before of a key whose default is what configs meant before it existed


@dataclass(frozen=True)
class Key:
    name: str                       # the flat trial key
    group: str                      # model | embedding | data | train
    check: Check
    default: Any                    # None where doc says what None means
    doc: str
    unit: str = ""
    section: str | None = None      # campaign-file section that sets it; None: only the space does
    section_key: str | None = None  # its name there (default: name)
    searchable: bool = True         # a space may search over it
    applies_to: tuple[str, ...] = ()  # values of applies_key it means something for (empty: all); else null
    applies_key: str = "embedding"    # the key whose value decides whether this one applies
    families: tuple[str, ...] = ()    # model families it applies to (empty: all); else it is null
    report: bool = False            # a column of the report's trial tables
    required: bool = False
    before: Any = DEFAULT           # what a config written before the key existed meant (spaces.upgrade)
    macro: bool = False             # a timm constructor argument of the model's shape (MACRO_KEYS)
    sliced: bool = False            # a size a supernet holds as the leading part of its largest's tensors
    splits: tuple = ()              # a choice a supernet keeps weights per value of: (tensors, place in their names)

    @property
    def arrow(self) -> str:
        return self.check.arrow


_k = Key   # (name, group, check, default, doc, **the rest)
KEYS: dict[str, Key] = {k.name: k for k in (
    # model (campaign section `model`)
    _k("model", "model", MODEL_NAME, None,
       "timm model: a transformer whose attention maps tokens to q, k, v (docs: hosts), or an MLP-Mixer",
       section="model", section_key="name", required=True),
    _k("img_size", "model", integer(8, MAX_PIXELS).or_none(), None,
       "input size; null: the dataset's (32, imagefolder 224), or timm's for a bare model",
       unit="px", section="model"),
    _k("num_classes", "model", integer(2, MAX_CLASSES).or_none(), None,
       "classes; null: the dataset's (imagefolder: its class folders), or timm's for a bare model",
       section="model", searchable=False),
    _k("in_chans", "model", POS_INT, 3, "input channels", section="model", searchable=False),
    _k("drop_path_rate", "model", FRACTION, 0.0, "stochastic depth rate", section="model"),
    # macro shape (timm constructor arguments; the space sets them)
    _k("depth", "model", integer(1, MAX_BLOCKS).or_none(), None, "transformer blocks; null: timm's for the model",
       unit="blocks", macro=True, sliced=True),
    _k("embed_dim", "model", integer(1, MAX_UNITS).or_none(), None, "token dim d; null: timm's for the model",
       unit="channels", macro=True, sliced=True),
    _k("num_heads", "model", integer(1, MAX_UNITS).or_none(), None, "attention heads; null: timm's for the model",
       families=(VIT, XCIT), macro=True, sliced=True),
    _k("mlp_ratio", "model", number(0, MAX_MLP_RATIO, low_open=True, high_open=False).or_none(), None,
       "MLP hidden width / d (MLP-Mixer: the channel-mixing MLP's); null: timm's for the model",
       macro=True, sliced=True),
    _k("token_mlp_ratio", "model", number(0, MAX_MLP_RATIO, low_open=True, high_open=False).or_none(), None,
       "MLP-Mixer: token-mixing MLP hidden width / d; null: timm's for the model", families=(MIXER,),
       macro=True, sliced=True),
    _k("patch_size", "model", integer(1, MAX_PIXELS).or_none(), None, "patch side; null: timm's for the model",
       unit="px", macro=True),
    _k("qkv_bias", "model", FLAG.or_none(), None,
       "a bias on the q, k and v projections (timm's qkv_bias); null: the model's own (timm's ViT/DeiT: true)",
       families=(VIT,), applies_key="attention", applies_to=QKV_ATTENTIONS, macro=True),
    # attention design (spaces.choices, trainers.model.architecture): ViT/DeiT only, except key and patch_embed
    _k("attention", "model", one_of(*ATTENTIONS), "softmax",
       "token mixer: " + " | ".join(ATTENTIONS) + " (ViT/DeiT)", families=(VIT,), report=True, splits=("attention", 1)),
    _k("attn_features", "model", integer(1, MAX_UNITS), 64, "Performer random features m", unit="features",
       applies_key="attention", applies_to=sized_by("attn_features"), report=True, sliced=True),
    _k("attn_proj_len", "model", integer(1, MAX_UNITS), 64, "Linformer projected length k", unit="tokens",
       applies_key="attention", applies_to=sized_by("attn_proj_len"), report=True, sliced=True),
    _k("attn_landmarks", "model", integer(1, MAX_UNITS), 32, "Nystromformer landmarks m", unit="tokens",
       applies_key="attention", applies_to=sized_by("attn_landmarks"), report=True, sliced=True),
    _k("pos_embed", "model", one_of(*POS_EMBEDS), "learned", "positions: " + " | ".join(POS_EMBEDS) + " (ViT/DeiT)",
       families=(VIT,), report=True, splits=("positions", 0)),
    _k("patch_embed", "model", one_of(*PATCH_EMBEDS), "linear",
       "patch embedding: " + " | ".join(PATCH_EMBEDS) + " (ViT/DeiT, MLP-Mixer)", families=(VIT, MIXER),
       report=True, splits=("stem", 0)),
    _k("key", "model", one_of(*KEY_KINDS), "shared",
       "key: shared (from the q/k/v embedding) | manifold (charts, apart from q and v)", report=True,
       splits=("attention", 2)),
    _k("key_charts", "model", integer(1, MAX_UNITS), 8, "manifold key: charts H", applies_key="key",
       applies_to=("manifold",), report=True, sliced=True),
    _k("key_aggregation", "model", one_of(*KEY_AGGREGATIONS), "vanilla",
       "manifold key: chart aggregation " + " | ".join(KEY_AGGREGATIONS), applies_key="key",
       applies_to=("manifold",), report=True, splits=("attention", 3)),
    _k("key_context", "model", FLAG, False, "manifold key: add the token mean (context broadcasting)",
       applies_key="key", applies_to=("manifold",), splits=("attention", 4)),
    # embedding (the space sets them; the model section also sets embed_class_attn and activation)
    _k("embedding", "embedding", one_of(*EMBEDDINGS), "linear", "q/k/v embedding: " + " | ".join(EMBEDDINGS),
       report=True, splits=("attention", 0)),
    _k("hidden_width", "embedding", HIDDEN_WIDTH, PAPER_WIDTH,
       "requested hidden width h: int, ratio of the token dim d, match (baseline params), paper (Table 1)",
       applies_to=embeddings_with("hidden"), report=True, sliced=True),
    _k("code_size", "embedding", integer(1, MAX_UNITS), 8, "F-SNE code size n", unit="features",
       applies_to=embeddings_with("codes"), report=True, sliced=True),
    _k("code_sharing", "embedding", one_of("shared", "per_block"), "shared",
       "F-SNE codes: one set for the network, or one per block", applies_to=embeddings_with("codes"), report=True,
       splits=("attention", 6)),
    _k("embed_class_attn", "embedding", FLAG, False, "also embed the class-attention blocks (XCiT, CaiT, VOLO)",
       section="model"),
    _k("activation", "embedding", one_of(*ACTIVATIONS), "relu", "the embedding's non-linearity sigma",
       section="model", report=True, splits=("attention", 5)),
    # quantization policy (the space sets them): one precision per part, the part's in every block without its own
    # (quant_qkv.3: spaces.blocks)
    *(_k(key, "quant", one_of(*PRECISIONS), FULL_PRECISION,
         f"precision of {what}, applied after training: " + " | ".join(PRECISIONS), report=True)
      for key, what in QUANT_PARTS.items()),
    # data (campaign section `data`)
    _k("dataset", "data", one_of(*DATASETS), "digits", "dataset: " + " | ".join(DATASETS),
       section="data", searchable=False),
    _k("data_path", "data", TEXT.or_none(), None, "the dataset's root folder (cifar10, cifar100, imagefolder, "
       "stl10, cars, hfds, wds); wds: also a bucket prefix (s3://, gs://)",
       section="data", section_key="path", searchable=False),
    _k("val_fraction", "data", number(0, 1, low_open=True), 0.2,
       "digits and synthetic: share held out for validation", section="data", searchable=False),
    _k("data_pipeline", "data", one_of(*PIPELINES), "auto",
       "input path: host (PIL decoding and timm's transforms in loader processes) | device (images decoded once "
       "into a prepared dataset, or held in memory; loaders ship uint8, augmentation batched on the trial's "
       "device) | decode (image files decoded on the trial's device, nothing prepared) | auto (device on CUDA, "
       "host on CPU)", section="data", section_key="pipeline", searchable=False),
    _k("bad_images", "data", one_of(*BAD_IMAGE_POLICIES), "refuse",
       "unreadable source images (zero-byte, truncated, corrupt) the device paths find: refuse (name them and "
       "stop) | skip (leave them out, counted and named)", section="data", searchable=False),
    # train (campaign section `train`)
    _k("epochs", "train", POS_INT, None, "epochs every trial trains for (the schedulers' budget)",
       unit="epochs", section="train", searchable=False, required=True),
    _k("batch_size", "train", POS_INT, 64, "global batch: images per optimizer update over all workers",
       unit="images", section="train"),
    _k("batch_per_worker", "train", POS_INT.or_none(), None,
       "images per forward pass on one worker; null: batch_size / workers (no accumulation)",
       unit="images", section="train"),
    _k("lr", "train", POS_NUM, 1e-3, "peak learning rate after warm-up", section="train", report=True),
    _k("weight_decay", "train", NONNEG_NUM, 0.05, "AdamW-style decoupled weight decay", section="train"),
    _k("warmup_epochs", "train", NONNEG_NUM, 1.0, "linear warm-up; may be fractional", unit="epochs",
       section="train"),
    _k("min_lr", "train", NONNEG_NUM, 1e-5, "learning rate at the end of the schedule", section="train"),
    _k("warmup_lr", "train", NONNEG_NUM, 1e-6, "learning rate at the start of warm-up", section="train"),
    _k("opt", "train", OPTIMIZER, "adamw", "timm optimizer name", section="train"),
    _k("sched", "train", one_of(*LR_SCHEDULES), "cosine", "timm learning-rate schedule, stepped per update",
       section="train"),
    _k("label_smoothing", "train", FRACTION, 0.0, "label smoothing", section="train"),
    _k("mixup", "train", NONNEG_NUM, 0.0, "Mixup alpha; 0 = off", section="train"),
    _k("cutmix", "train", NONNEG_NUM, 0.0, "CutMix alpha; 0 = off", section="train"),
    _k("randaugment", "train", AUTO_AUGMENT.or_none(), None, "timm auto_augment string; null = off",
       section="train"),
    _k("augment", "train", FLAG, False, "timm training transform (random resized crop + flip)",
       section="train"),
    _k("random_erasing", "train", FRACTION, 0.0, "timm random erasing probability per image (per-pixel "
       "noise, as DeiT); 0 = off", section="train"),
    _k("clip_grad", "train", POS_NUM.or_none(), None, "max global gradient norm; null = off", section="train"),
    _k("seed", "train", SEED, 0, "seed of weights, data order and augmentation", section="train"),
    _k("checkpoint_every", "train", POS_INT, 1, "epochs between checkpoints (the last is always saved)",
       unit="epochs", section="train"),
    _k("max_steps_per_epoch", "train", POS_INT.or_none(), None,
       "cap on optimizer updates per epoch; null = the whole training set", section="train"),
    _k("deterministic", "train", FLAG, False, "deterministic torch kernels", section="train"),
    _k("amp", "train", one_of("auto", "bf16", "none"), "auto", "mixed precision: auto = bf16 on CUDA, none on CPU",
       section="train"),
    _k("compile", "train", AUTO_FLAG, "auto",
       "torch.compile the model: auto = on CUDA for runs long enough to repay compiling "
       "(trainers.training.engine.COMPILE_MIN_UPDATES)", section="train"),
    _k("loader_workers", "train", WORKERS, 0, "DataLoader processes per worker (PIL-decoded and shard datasets); "
       "auto: enough to keep its device fed, measured when it starts (trainers.training.feeding)", section="train"),
)}

# The architecture keys (trainers.model.architecture): timm's constructor arguments (the macro shape and the q/k/v
# bias), then the attention design: every other model key the space alone sets.
MACRO_KEYS = tuple(k.name for k in KEYS.values() if k.macro)
DESIGN_KEYS = tuple(k.name for k in KEYS.values() if k.group == "model" and k.section is None and not k.macro)
ARCHITECTURE_KEYS = MACRO_KEYS + DESIGN_KEYS

WIDTH = Key("width", "embedding", NONNEG_INT, None, "hidden units h the embedding uses (hidden_width solved; "
            "0 for linear)", searchable=False, report=True)  # derived, not settable
# The keys of a resolved trial config: the declared ones, the solved width beside the requested one.
RESOLVED_KEYS: dict[str, Key] = {}
for _key in KEYS.values():
    RESOLVED_KEYS |= {_key.name: _key, **({WIDTH.name: WIDTH} if _key.name == "hidden_width" else {})}


def names(*groups: str) -> tuple[str, ...]:
    return tuple(k.name for k in KEYS.values() if k.group in groups)


def section_keys(section: str) -> dict[str, Key]:
    """section key -> Key for one campaign-file section (model, data, train)."""
    return {k.section_key or k.name: k for k in KEYS.values() if k.section == section}


SEARCHABLE: dict[str, Check] = {k.name: k.check for k in KEYS.values() if k.searchable}

# ---------------------------------------------------------------------------------------------- per-block keys
# (spaces.blocks: their names; here, what declares them)


def key_of(name) -> Key | None:
    """The declaration a trial key follows: its own, or its key's for a per-block key (None: not a trial key)."""
    split = split_block_key(name)
    return KEYS[split[0]] if split else RESOLVED_KEYS.get(name)


def searchable_check(name) -> Check | None:
    """The check of a key a space may search (per-block keys included), or None."""
    split = split_block_key(name)
    return SEARCHABLE[split[0]] if split else SEARCHABLE.get(name)


def model_keys(cfg: Mapping, *extra: str) -> dict:
    """The keys of ``cfg`` that decide its model: those of the model and embedding groups and ``extra`` (e.g.
    "width", or QUANT_KEYS for the model as deployed), with the per-block keys of each."""
    keys = (*names(*MODEL_GROUPS), *extra)
    return {k: cfg.get(k) for k in keys} | {k: cfg[k] for k in block_keys(cfg, keys)}


BLOCK_CHECKS = {k: KEYS[k].check for k in PER_BLOCK_KEYS}   # a per-block key is checked as its key
# key -> (the key deciding it, the values it applies for)
APPLIES_WHEN: dict[str, tuple[str, tuple[str, ...]]] = {
    k.name: (k.applies_key, k.applies_to) for k in KEYS.values() if k.applies_to}
REQUIRED_TRAIN_KEYS = tuple(k.section_key or k.name for k in KEYS.values() if k.section == "train" and k.required)

# ---------------------------------------------------------------------------------------------- fill


def fill(cfg: Mapping, groups: tuple[str, ...] = GROUPS) -> dict:
    """A copy of ``cfg`` with every key of ``groups`` checked and its default filled in.

    Keys of other groups pass through unchecked. A key that applies only to some embeddings is null for the others
    (giving it a value there is an error). With the data group: img_size and num_classes come from the dataset when
    null, and the data-dependent rules are checked. ``width`` (the solved width) passes through. Raises ConfigError
    naming the key, the expected and the given value."""
    if not isinstance(cfg, Mapping):
        raise config_error("config", "a mapping of trial keys", cfg)
    for key in cfg:
        if key_of(key) is None:
            known = list(RESOLVED_KEYS)
            raise config_error(str(key), "a trial key" + hint(str(key), known, list_known=False), key)
    out = dict(cfg)
    for key in KEYS.values():
        if key.group not in groups:
            continue
        value = out.get(key.name)
        unless = not_applicable(key, out, groups)
        if unless:
            if value is not None and not _follows_blocks(key, out):
                raise config_error(key.name, f"null unless {unless}", value)
            out[key.name] = None
            continue
        if value is None:
            if key.required:
                raise ConfigError(f"{key.name}: required ({key.doc})")
            value = key.default
        if value is not None:
            try:
                value = key.check(value)
            except Bad as bad:
                raise config_error(key.name, bad.expected or key.check.expected, value) from None
        out[key.name] = value
    if "width" in out and out["width"] is not None:
        try:
            WIDTH.check(out["width"])
        except Bad:
            raise config_error("width", WIDTH.check.expected, out["width"]) from None
    checks = {k: c for k, c in BLOCK_CHECKS.items() if KEYS[k].group in groups}   # the groups' per-block keys
    if checks:
        check_blocks(out, checks, APPLIES_WHEN, config_error)
    if "model" in groups and "embedding" in groups:
        check_combinations(out)
    if "data" in groups:
        fill_from_dataset(out)
    return out


def model_family(model) -> str:
    return _family(model, REGISTERED_PREFIX)


def _follows_blocks(key: Key, out: Mapping) -> bool:
    """Whether ``key`` applies by a key the config draws per block (code_size where blocks choose their own
    embedding): such a key is null, not an error, in a config none of whose blocks takes it, since a space draws
    it for the whole model whatever its blocks drew."""
    return any(split_block_key(k)[0] == key.applies_key for k in block_keys(out))


def not_applicable(key: Key, out: Mapping, groups=GROUPS) -> str:
    """Why ``key`` is null for this config ('' when it applies); reads keys filled before it."""
    family = model_family(out.get("model"))
    if key.families and family not in key.families:
        labels = " or ".join(FAMILIES[f].label for f in key.families)
        return f"the model is {labels} ({out.get('model')} {FAMILIES[family].keeps})"
    if not key.applies_to:
        return ""
    ak = KEYS[key.applies_key]
    cond = out.get(ak.name)
    if cond is None and (ak.group not in groups or ak.name not in out):
        cond = ak.default
    if cond in key.applies_to or any(v in key.applies_to for v in block_values(out, ak.name) - {None}):
        return ""
    return f"{ak.name} is {' or '.join(key.applies_to)} ({ak.name} is {cond})"


def check_combinations(cfg: Mapping) -> None:
    """Model keys that cannot work together (rules needing the resolved shape: trainers.model.architecture)."""
    family = model_family(cfg.get("model"))
    unmet = unmet_need(cfg, family)   # what the chosen attention or family cannot work with
    if unmet:
        raise config_error(*unmet)
    for name in block_keys(cfg):      # a block's own value, as its key's would be
        key = split_block_key(name)[0]
        unmet = unmet_need({**cfg, key: cfg[name]}, family)
        if unmet and unmet[0] == key:
            raise config_error(name, unmet[1], unmet[2])
    if cfg.get("hidden_width") == "match" and any(split_block_key(k)[0] == "embedding" for k in block_keys(cfg)):
        raise config_error("hidden_width", "a width of the blocks' own (an int, a ratio of d, or \"paper\") "
                           "with per-block embeddings: \"match\" solves one width for one embedding", "match")
    if (cfg.get("key") == "manifold" and cfg.get("embed_class_attn")
            and cfg.get("embedding") in embeddings_with("hidden")):
        raise config_error("embed_class_attn", "false with key manifold and a non-linear embedding (class attention "
                           "keeps its own key; its q/k/v and the blocks' q/v cannot share codes)", True)


def flatten(section: str, values: Mapping) -> dict:
    """A campaign-file section's values keyed by trial key (model.name -> model, data.path -> data_path)."""
    table = section_keys(section)
    return {table[k].name: v for k, v in values.items()}


def identity(config: Mapping, ignore: tuple[str, ...] = (), policy: bool = False) -> str:
    """What makes two resolved trials the same training: the config with null keys (those that do not apply to the
    trial) left out, and the solved ``width`` standing for the requested ``hidden_width``. The quantization policy
    changes nothing in training: its keys (a block's own included) are left out, unless ``policy`` (then the model
    as deployed, its policy as ``quant_policy`` gives it: a config without policy keys and one whose policy is all
    ``fp`` are one model). ``ignore``: keys left out too (``("seed",)``). A dataset read by index trains the same
    with any ``loader_workers``: it counts as its default there (spaces.datasets.Dataset.dealt)."""
    skip = {"hidden_width", *ignore}
    kept = {k: v for k, v in config.items() if v is not None and k not in skip and not is_policy_key(k)}
    if "loader_workers" in kept and not getattr(DATASET_INFO.get(config.get("dataset")), "dealt", False):
        kept["loader_workers"] = KEYS["loader_workers"].default
    if policy:
        kept |= {k: v for k, v in quant_policy(config).items() if k not in skip}
    return json.dumps(kept, sort_keys=True)


def require_filled(cfg) -> dict:
    """``cfg`` itself when ``fill`` has run on it (every key present): trainers take filled configs, so
    defaults are decided once, where a trial's config is built."""
    missing = [k for k in KEYS if not isinstance(cfg, Mapping) or k not in cfg]
    if missing:
        raise ConfigError(f"config: expected a filled trial config (qkvsearch.spaces.keys.fill(cfg)), given one "
                          f"without {', '.join(missing)}")
    return cfg
