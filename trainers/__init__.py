"""Models (q/k/v embeddings and attention designs on timm models), their cost, data and the per-worker DDP
training.

- models: ``build_model(cfg)``; hosts: the model families (ViT, XCiT, MLP-Mixer) built by timm;
  architecture: the architecture keys as classes and timm arguments; choices: the registries, one class per
  value of each choice key (the names: spaces.choices); attention/: those classes; embeddings: the q/k/v
  embeddings; registry: the ``qkv_*`` timm models.
- cost: ``model_cost`` / ``resolve_trial`` (params and MACs from the config); paper_counts: the Vision
  X-formers paper's counts beside ours; measure: measured latency, throughput and memory.
- data (datasets by name, shards), sources (in-memory and PIL sources), data_sources (the file formats).
- engine (the training loop), loop (the Ray Train adapter), checkpoints (run folders, local mode), cli (the
  plain path), transfer and ood_metrics (stages after the search), faults and errors.
- supernet/: one-shot search's weight-sharing supernet, its training (sandwich rule) and subnet scoring.
- quantize (post-training quantization policies with torchao), policy_eval (a policy on trained weights).

`build_model` is resolved on first use: importing `trainers.<module>` must not pay for timm's import
in processes that never build a model (Ray Train's controller unpickles `trainers.loop`).
"""

__all__ = ["build_model"]


def __getattr__(name: str):
    if name == "build_model":
        from qkvsearch.trainers.models import build_model

        return build_model
    raise AttributeError(f"module 'trainers' has no attribute {name!r}")
