"""Models (QKV embeddings on timm transformers), cost, data and the per-worker DDP training loop.

`build_model` is resolved on first use: importing `trainers.<module>` must not pay for timm's import
in processes that never build a model (Ray Train's controller unpickles `trainers.loop`).
"""

__all__ = ["build_model"]


def __getattr__(name: str):
    if name == "build_model":
        from qkvsearch.trainers.models import build_model

        return build_model
    raise AttributeError(f"module 'trainers' has no attribute {name!r}")
