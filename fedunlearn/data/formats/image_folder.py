"""Images in torchvision's ``ImageFolder`` layout, one folder per class.

Two layouts are read:

- ``root/train/<class>/*.png`` and ``root/test/<class>/...``: the splits as given (whenever ``root``
  holds both a ``train`` and a ``test`` folder; other folders beside them, e.g. ``val``, are ignored);
- ``root/<class>/*.png``: one set, split by :func:`~fedunlearn.data.formats.common.stratified_split`
  (``test-fraction`` of each class held out, seeded with ``seed``).

Class names are the training folders' names, sorted (``ImageFolder``'s rule): the code of a class is
its position in that order. A test folder must name a training class. Files are those with an image
extension torchvision knows (``.png``, ``.jpg``, ``.jpeg``, ``.bmp``, ``.ppm``, ``.pgm``, ``.tif``,
``.tiff``, ``.webp``); others are skipped, as ``ImageFolder`` skips them.

Every image must have one size (no resizing: a model's input shape is the data's); a second size is
refused with one file of each size. Channels: if every image is grayscale (PIL modes ``1``, ``L``,
``LA``) they are read as one channel, otherwise every image is converted to RGB (grayscale repeated,
palettes expanded, alpha dropped), as ``ImageFolder``'s own loader converts all to RGB. High bit-depth
images (modes ``I``, ``I;16``, ``F``) are refused: scaling them as 8-bit pixels would be wrong.
Pixels are scaled to [0, 1] and standardised per channel with the training split's statistics.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedunlearn.data.datasets import DatasetSplits, image_splits
from fedunlearn.data.formats.common import (
    data_path,
    label_codes,
    stratified_split,
    unusable,
)

NAME = "image-folder"
EXPECTED = (
    "a folder of class folders of images (<class>/*.png), or train/ and test/ folders of them"
)
GRAYSCALE_MODES = frozenset(("1", "L", "LA"))
#: Modes whose values are not 8-bit; refused rather than scaled wrongly.
HIGH_DEPTH_MODES = frozenset(("I", "F", "I;16", "I;16B", "I;16L", "I;16N"))


def load_image_folder(source) -> DatasetSplits:
    """Load an ``ImageFolder`` tree (see the module docstring) as standardised image splits.

    Parameters
    ----------
    source : DataSource
        ``root`` the folder; ``seed`` and ``test_fraction`` split a tree with no ``train``/``test``.

    Returns
    -------
    DatasetSplits
        Images ``(N, C, H, W)`` float32, C = 1 (all grayscale) or 3; labels the sorted class codes.

    Raises
    ------
    ConfigError
        ``data-root`` unset, or ``test-fraction`` out of range.
    DatasetNotFoundError
        The folder is missing, holds no images, an image is unreadable, of another size or of a
        high bit-depth mode, a test class is not a training class, or fewer than two classes.
    """
    return read_image_folder(source)[0]


def read_image_folder(source) -> tuple[DatasetSplits, list[str]]:
    """:func:`load_image_folder`'s splits and the class names in code order."""
    root = data_path(source, NAME, EXPECTED)
    if not root.is_dir():
        raise unusable(NAME, root, f"not a folder; data-root should be {EXPECTED}")
    if _is_split_layout(root):
        train_files, train_names = _samples(root / "train")
        test_files, test_names = _samples(root / "test")
    else:
        files, names = _samples(root)
        train, test = stratified_split(np.asarray(names), source, NAME, root)
        train_files, train_names = [files[i] for i in train], [names[i] for i in train]
        test_files, test_names = [files[i] for i in test], [names[i] for i in test]
    train_y, test_y, classes = label_codes(train_names, test_names, NAME, root)
    train_x, test_x = images_as_arrays([train_files, test_files], NAME, root)
    splits = image_splits(NAME, (train_x, train_y), (test_x, test_y), 255.0, len(classes))
    return splits, classes


def _is_split_layout(root: Path) -> bool:
    return (root / "train").is_dir() and (root / "test").is_dir()


def _samples(folder: Path) -> tuple[list[Path], list[str]]:
    """Every image file under ``folder``'s class folders and its class name, ``ImageFolder``'s way."""
    from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset

    classes = sorted(entry.name for entry in folder.iterdir() if entry.is_dir())
    if not classes:
        raise unusable(NAME, folder, f"no class folders in it; data-root should be {EXPECTED}")
    try:
        samples = make_dataset(
            str(folder), {name: code for code, name in enumerate(classes)}, IMG_EXTENSIONS
        )
    except FileNotFoundError as error:  # a class folder holds no image
        raise unusable(NAME, folder, " ".join(str(error).split())) from error
    return [Path(path) for path, _ in samples], [classes[code] for _, code in samples]


def images_as_arrays(groups: list[list], name: str, where: Path) -> list[np.ndarray]:
    """Decode groups of images into uint8 arrays ``(N, C, H, W)``.

    An item is a path or a ``(description, PIL image)`` pair (the description, e.g. ``"row 3"``,
    names it in errors).

    All groups share one size and one channel rule (the module docstring's), so that train and
    test images agree.
    """
    images = [[_opened(item, name) for item in group] for group in groups]
    flat = [(item, image) for group in images for item, image in group]
    if not flat:
        raise unusable(name, where, "it holds no images")
    first_item, first = flat[0]
    for item, image in flat:
        if image.mode in HIGH_DEPTH_MODES:
            raise unusable(
                name, where, f"{_label(item)} has mode {image.mode!r}; only 8-bit images are read"
            )
        if image.size != first.size:
            raise unusable(
                name,
                where,
                f"images of two sizes: {_label(first_item)} is {_size(first)}, "
                f"{_label(item)} is {_size(image)}; resize them to one size",
            )
    mode = "L" if all(image.mode in GRAYSCALE_MODES for _, image in flat) else "RGB"
    return [_stack([image for _, image in group], mode, first) for group in images]


def _opened(item, name: str) -> tuple:
    """``(item, PIL image)`` with the pixels loaded; a path that PIL cannot decode is refused."""
    from PIL import Image

    if isinstance(item, tuple):
        return item
    try:
        with Image.open(item) as image:
            image.load()
            return item, image.copy()
    except Exception as error:  # PIL raises OSError, SyntaxError, DecompressionBombError...
        raise unusable(
            name, Path(item), f"not a readable image ({type(error).__name__}: {error})"
        ) from error


def _stack(images: list, mode: str, first) -> np.ndarray:
    width, height = first.size
    channels = 1 if mode == "L" else 3
    array = np.empty((len(images), channels, height, width), dtype=np.uint8)
    for index, image in enumerate(images):
        pixels = np.asarray(image.convert(mode), dtype=np.uint8)
        array[index] = pixels[np.newaxis] if mode == "L" else pixels.transpose(2, 0, 1)
    return array


def _label(item) -> str:
    return str(item[0]) if isinstance(item, tuple) else str(item)


def _size(image) -> str:
    return f"{image.size[0]}x{image.size[1]}"
