"""Search-space definitions: the campaign schema and the shipped YAML presets.

A campaign file (YAML; unknown keys are rejected at every level, with a did-you-mean hint)::

    name: pareto-s                       # experiment folder name (default: the file name)
    description: free text               # optional
    model: {name: xcit_nano_12_p16_224, img_size: 224, num_classes: 1000,
            in_chans: 3, embed_class_attn: false, drop_path_rate: 0.0, activation: relu}
    data: {dataset: imagefolder, path: /data/imagenet, val_fraction: null}
          # dataset: digits | digits_clutter | cifar10 | cifar100 | imagefolder | synthetic (spaces.datasets);
          # path required for cifar*/imagefolder
    train: {epochs: 400, batch_size: 4096, lr: 5.0e-4, warmup_epochs: 5, ...}
          # keys, checks and defaults: spaces.keys.KEYS (section train); epochs required
    space:                               # trial keys (spaces.keys.SEARCHABLE) -> dimension
      embedding: {choice: [linear, sne, psne, fsne]}   # the searcher picks one
      hidden_width: [0.5, 1.0, match]                  # a list is a choice; a scalar is a fixed value
      code_size: {grid: [8, 16], when: {embedding: fsne}}   # grid: enumerated (algorithm grid only)
      lr: {float: [1.0e-4, 1.0e-3], log: true}         # ranges: [low, high]; int ranges include both ends
      seed: {int: [0, 3]}
      variants: [{embedding: linear}, {embedding: sne, hidden_width: 0.5}]   # explicit combinations
      # embedding: {choice: [linear, sne], per_block: true}   # one per block: embedding.0, ... (spaces.blocks)
    objectives: [{metric: top1, mode: max}, {metric: gmacs, mode: min}]   # mode defaults per metric
    constraints: {params_m: {max: 4.0}}  # cost metrics only (params, params_m, embed_params, gmacs), bounds >= 0
    search: {algorithm: nsga2, num_trials: 64, seed: 0, population_size: 16}
          # grid | random | tpe | nsga2 | gp, ehvi (n_startup_trials: n < num_trials); grid: num_trials = grid
          # size x repeats (repeats: n, any algorithm: each configuration under n seeds; front_repeats: n, the
          # final front's configurations under more seeds once the search ends); warm_start: <earlier campaign
          # folder or URI>
    scheduler: {type: moasha, grace_epochs: 10, reduction_factor: 3, brackets: 3}  # fifo | asha (metric, mode) | moasha
          # brackets: asynchronous Hyperband (default: 3 for moasha, fewer when fewer rungs fit; 1 for asha)
    resources: {workers_per_trial: 8, cpus_per_worker: 8, gpus_per_worker: 1,
                max_concurrent_trials: auto, placement_strategy: PACK}
    storage: results/                    # a local path or s3:// gs:// gcs:// file:// hdfs:// abfs://
    stages: {finetune: [{dataset: cifar10, path: ..., epochs: 100, lr: 5.0e-5}], ood: {...}}   # spaces.stages

Trials: one variant (if any) x one value per active dimension. ``when: {key: value or [values]}``
switches a dimension on only when the named space keys hold those values. hidden_width (sne/psne/
fsne), code_size and code_sharing (fsne) get their embedding condition added automatically when the
embedding may take other values; contradicting it is an error. ``per_block: true`` (embedding,
hidden_width, and the precisions quant_qkv, quant_proj, quant_mlp, quant_token_mlp) draws a value per block, as
the keys embedding.<i>, hidden_width.<i>, quant_qkv.<i>, ... (see spaces.dimensions).

Hidden widths: a positive int is absolute, a float in (0, 4] is a ratio of the token dim d, "match"
raises the width until the model has the linear baseline's parameter count, "paper" (the default,
also written null) = the paper's Table 1 width.

API: load_campaign(path | preset name | dict, overrides=["train.epochs=10", ...], check_names=True) -> CampaignSpec
(check_names=False: timm model and optimizer names taken as given, so that validation imports neither timm nor
torch; loader.read_stored_spec reads a campaign file's stored spec as far as it goes);
spec.to_dict(); base_config(spec); expand_space(spec); suggest_config(spec, optuna_trial);
smoke_test(spec); list_presets();
preset_path(name). Errors: SpecError (a ValueError) listing every problem, one per line.
"""
from qkvsearch.spaces.errors import BadInput, SpecError
from qkvsearch.spaces.loader import load_campaign
from qkvsearch.spaces.reading import list_presets, preset_path
from qkvsearch.spaces.schema import Dimension, Space
from qkvsearch.spaces.spec import CampaignSpec
from qkvsearch.spaces.trials import base_config, expand_space, smoke_test, suggest_config

__all__ = [
    "BadInput",
    "CampaignSpec",
    "Dimension",
    "Space",
    "SpecError",
    "base_config",
    "expand_space",
    "list_presets",
    "load_campaign",
    "preset_path",
    "smoke_test",
    "suggest_config",
]
