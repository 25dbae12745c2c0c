"""Models (q/k/v embeddings and attention designs on timm models), their cost, data, the per-worker DDP
training and what a trained model is measured and served with, in sub-packages by role (lowest first; a
module imports its own sub-package and lower ones, tests/search/test_layers.py):

- model/: building a model and counting it: ``build_model(cfg)`` (models), the model families timm builds
  (hosts), the architecture keys (architecture), the registries (choices) of the classes in attention/ and
  the q/k/v embeddings (embeddings, embedding_forms), the ``qkv_*`` timm models (registry), params and MACs
  (cost, paper_counts), post-training quantization (quantize).
- data/: datasets by name as batches (datasets), sources (in memory, PIL), file formats (formats), WebDataset
  shards (shard_index, shard_deal, shard_source) and Parquet / Arrow folders (hf_folder).
- training/: the per-rank engine (engine), run folders and state files (checkpoints), the plain path (cli),
  faults and errors.
- deploy/: measured latency, throughput and memory (measure), a quantization policy on trained weights
  (policy_eval).
- stages/: the stages after the search: transfer (fine-tuning's evaluation, OOD scores), ood_metrics.
- supernet/: one-shot search's weight-sharing supernet, its training (sandwich rule) and subnet scoring.
- ray_train/: the Ray Train adapter (loop): a trial's training, or a supernet's, on Ray Train workers; every Ray
  import of trainers.

Module paths of earlier layouts (the flat one before these sub-packages: ``qkvsearch.trainers.engine``,
``python -m qkvsearch.trainers.loop``; ``qkvsearch.trainers.training.loop`` before ray_train/) stay importable,
each to the module that holds its names now (qkvsearch._legacy; tests/test_earlier_paths.py imports every one).

`build_model` is resolved on first use: importing `trainers.<module>` must not pay for timm's import
in processes that never build a model (Ray Train's controller unpickles `trainers.ray_train.loop`).
"""

__all__ = ["build_model"]


def __getattr__(name: str):
    if name == "build_model":
        from qkvsearch.trainers.model.models import build_model

        return build_model
    raise AttributeError(f"module 'trainers' has no attribute {name!r}")
