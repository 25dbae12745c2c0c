"""Data: a config's dataset as batches of normalised (B, C, H, W) tensors, sharded per rank.

- datasets: datasets by name, the checks before any worker starts, the training and validation splits;
- sources: where batches come from (in memory, PIL images through a DataLoader) and the timm transforms;
- formats: the file formats (CIFAR, STL-10, Stanford Cars, the embedded digits, OOD image sets);
- shard_index, shard_deal, shard_source: WebDataset shards (timm's info file, the deal to ranks and loader
  processes, the reading);
- hf_folder: local Parquet / Arrow folders as Hugging Face ``datasets`` reads them.

The names of the module this package replaced (``trainers.data``: now datasets) are found here too.
"""


def __getattr__(name: str):
    from qkvsearch import _legacy

    return _legacy.attribute(__name__, name)
