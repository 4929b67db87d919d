"""scikit-learn's bundled 8x8 digits: the embedded default, no files and no network."""

from __future__ import annotations

import numpy as np

from fedunlearn.data.datasets import DatasetSplits, image_splits


def load(source) -> DatasetSplits:
    """scikit-learn's bundled 8x8 digits, split 75/25 with stratification on the label, the split
    seeded by ``source.seed``."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    images = np.asarray(bunch.images, dtype=np.float32)[:, np.newaxis]  # (N, 1, 8, 8), values 0..16
    labels = np.asarray(bunch.target, dtype=np.int64)
    train_x, test_x, train_y, test_y = train_test_split(
        images, labels, test_size=0.25, stratify=labels, random_state=source.seed
    )
    return image_splits("digits", (train_x, train_y), (test_x, test_y), scale=16.0)
