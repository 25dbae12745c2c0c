"""Small datasets stored by split, written by the tests that read them: WebDataset tar shards with timm's info
file (trainers.data.shard_index), and Parquet folders as datasets.load_dataset reads them (trainers.data.hf_folder).

Every sample's image encodes its id: a flat PNG whose first two pixels' red and green bytes give id // 256 and
id % 256, so a test reading decoded batches can tell which samples it got (up to 65,536 of them)."""
import io
import json
import tarfile

import numpy as np

SIDE = 8   # px of the written images


def png(sample_id: int, side: int = SIDE) -> bytes:
    """A side x side RGB PNG whose pixels all hold (id // 256, id % 256, 0)."""
    from PIL import Image

    a = np.zeros((side, side, 3), np.uint8)
    a[..., 0], a[..., 1] = sample_id // 256, sample_id % 256
    out = io.BytesIO()
    Image.fromarray(a).save(out, "PNG")
    return out.getvalue()


def sample_ids(x) -> list[int]:
    """The ids of a batch of images decoded without augmentation: x (B, 3, H, W) as eval_transform makes them
    (ImageNet-normalised), read back from the centre pixel."""
    from qkvsearch.trainers.data.sources import IMAGENET_MEAN, IMAGENET_STD

    h, w = x.shape[-2] // 2, x.shape[-1] // 2
    red = x[:, 0, h, w] * IMAGENET_STD[0] + IMAGENET_MEAN[0]
    green = x[:, 1, h, w] * IMAGENET_STD[1] + IMAGENET_MEAN[1]
    return [int(v) for v in ((red * 255).round() * 256 + (green * 255).round()).tolist()]


def tar_bytes(samples) -> bytes:
    """A tar of samples: each a dict {"__key__": name without dots, extension: bytes}."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for sample in samples:
            for ext, data in sample.items():
                if ext != "__key__":
                    entry = tarfile.TarInfo(f"{sample['__key__']}.{ext}")
                    entry.size = len(data)
                    tar.addfile(entry, io.BytesIO(data))
    return out.getvalue()


def write_wds(location: str, splits: dict[str, list[int]], classes: int = 3, first_id: int = 0) -> dict:
    """A shard set at ``location`` (a folder or an s3:// prefix): for each split, one shard per entry of its list
    (that many samples), named <split>-NNNN.tar; sample ids run on across splits from first_id, labels
    id % classes. Writes _info.json as timm's wds reader reads it and returns it."""
    from qkvsearch.storage import write_bytes

    info, next_id = {"name": "tiny", "splits": {}}, first_id
    for split, lengths in splits.items():
        names = []
        for i, n in enumerate(lengths):
            ids = range(next_id, next_id + n)
            next_id += n
            names.append(f"{split}-{i:04d}.tar")
            write_bytes(f"{location.rstrip('/')}/{names[-1]}", tar_bytes(
                {"__key__": f"s{k:06d}", "png": png(k), "cls": str(k % classes).encode()} for k in ids))
        info["splits"][split] = {"name": split, "num_samples": sum(lengths), "filenames": names,
                                 "shard_lengths": list(lengths)}
    write_bytes(f"{location.rstrip('/')}/_info.json", json.dumps(info, indent=1).encode())
    return info


def write_parquet_folder(folder, splits: dict[str, int], classes: int = 3) -> None:
    """<folder>/<split>-00000-of-00001.parquet for each split: columns image ({bytes, path}, as datasets' Image
    stores it) and label (int64, id % classes); ids run on across splits from 0."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    first = 0
    for split, n in splits.items():
        ids = range(first, first + n)
        first += n
        table = pa.table({"image": [{"bytes": png(k), "path": None} for k in ids],
                          "label": pa.array([k % classes for k in ids], pa.int64())})
        pq.write_table(table, folder / f"{split}-00000-of-00001.parquet")
