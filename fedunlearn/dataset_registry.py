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
DATASETS.register(
    "cifar100",
    "fedunlearn.data.sources.cifar100:load",
    description="CIFAR-100 colour images, 32x32, fine labels (50,000 + 10,000)",
    num_classes=100,
    sample_shape=(3, 32, 32),
    default_model="resnet18-cifar",
    layout="cifar-100-python/ (the pickled train and test files)",
    downloads="cifar-100-python.tar.gz from torchvision's mirror",
)

# Data in common forms, no code: data-root names the file or folder; the classes and the sample
# shape come from the data, and model = auto picks by that shape (docs/data-formats.md).
_FORMATS = "fedunlearn.data.formats"
DATASETS.register(
    "image-folder",
    f"{_FORMATS}.image_folder:load_image_folder",
    description="a folder of images per class (torchvision's ImageFolder), with or without train/ and test/",
    layout="<class>/<images> folders, or train/<class>/ and test/<class>/",
)
DATASETS.register(
    "table",
    f"{_FORMATS}.table:load_table",
    description="a CSV or Parquet table with a label column (label-column)",
    layout="a .csv or .parquet file, or a folder holding train.csv and test.csv",
    root_is_file=True,
)
DATASETS.register(
    "npz",
    f"{_FORMATS}.arrays:load_npz",
    description="NumPy arrays in an .npz file (x_train, y_train, x_test, y_test, or x, y)",
    layout="an .npz file",
    root_is_file=True,
)
DATASETS.register(
    "hf-disk",
    f"{_FORMATS}.hf_disk:load_hf_disk",
    description="a Hugging Face datasets folder written by save_to_disk (needs fedunlearn[hf])",
    layout="a folder written by datasets' save_to_disk",
)

# ---------------------------------------------------------------------- datasets a user adds
# One line each (docs/adding-a-dataset.md), e.g.
# DATASETS.register("my-data", "mypkg.data:load", num_classes=10, sample_shape=(1, 28, 28))
