"""Image datasets written as files, in the layouts the loaders read."""
import numpy as np


def write_imagefolder(root, classes, per_class, size=(20, 14)):
    """An ImageFolder tree: root/{train,val}/<class>/<i>.png, random RGB images of ``size`` (w, h)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for c in classes:
            (root / split / c).mkdir(parents=True)
            for i in range(per_class):
                a = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
                Image.fromarray(a).save(root / split / c / f"{i}.png")
