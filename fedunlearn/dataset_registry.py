"""The datasets a run's ``dataset`` key names: one :class:`~fedunlearn.dataset_spec.DatasetSpec`
per dataset, one line each (its loader is one module, imported when the dataset is loaded).

A dataset of your own needs no line here: ``dataset = "mypkg.data:load"`` in a run config loads it
through your function. To make it a named, built-in dataset, add its module and one line at the end
(``docs/adding-a-dataset.md``)::

    DATASETS.register("svhn", "fedunlearn.data.sources.svhn:load", num_classes=10,
                      sample_shape=(3, 32, 32), default_model="cifar10-cnn",
                      layout="svhn/ (train_32x32.mat, test_32x32.mat)")
"""

from __future__ import annotations

from fedunlearn.dataset_spec import DatasetRegistry

DATASETS = DatasetRegistry()

DATASETS.register(
    "digits",
    "fedunlearn.data.sources.digits:load",
    description="scikit-learn's 8x8 digits, embedded (1,797 samples): the default",
    num_classes=10,
    sample_shape=(1, 8, 8),
    default_model="digits-cnn",
    needs_root=False,
    layout="nothing (embedded in scikit-learn)",
)
DATASETS.register(
    "mnist",
    "fedunlearn.data.sources.idx:load_mnist",
    description="MNIST handwritten digits, 28x28 grey (60,000 + 10,000)",
    num_classes=10,
    sample_shape=(1, 28, 28),
    default_model="mnist-cnn",
    layout="MNIST/raw/ (the un-gzipped IDX files)",
    downloads="torchvision's MNIST mirrors",
)
DATASETS.register(
    "fashion-mnist",
    "fedunlearn.data.sources.idx:load_fashion_mnist",
    description="Fashion-MNIST clothing, 28x28 grey (60,000 + 10,000)",
    num_classes=10,
    sample_shape=(1, 28, 28),
    default_model="mnist-cnn",
    layout="FashionMNIST/raw/ (the un-gzipped IDX files)",
    downloads="torchvision's Fashion-MNIST mirrors",
)
DATASETS.register(
    "cifar10",
    "fedunlearn.data.sources.cifar10:load",
    description="CIFAR-10 colour images, 32x32 (50,000 + 10,000)",
    num_classes=10,
    sample_shape=(3, 32, 32),
    default_model="cifar10-cnn",
    layout="cifar-10-batches-py/ (data_batch_1..5 and test_batch)",
    downloads="cifar-10-python.tar.gz from torchvision's mirror",
)
DATASETS.register(
    "adult",
    "fedunlearn.data.sources.adult:load",
    description="UCI Adult census income, tabular (32,561 + 16,281)",
    num_classes=2,
    sample_shape=(108,),  # one column per number and per training category of the UCI files
    default_model="adult-mlp",
    layout="adult/adult.data and adult/adult.test",
    downloads="adult.data and adult.test from the UCI archive",
)

# ---------------------------------------------------------------------- datasets a user adds
# One line each (docs/adding-a-dataset.md), e.g.
# DATASETS.register("my-data", "mypkg.data:load", num_classes=10, sample_shape=(1, 28, 28))
