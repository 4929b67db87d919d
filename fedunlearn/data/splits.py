"""A dataset held as tensors: its train and test splits (:class:`DatasetSplits`), each a
:class:`TensorSplit` of inputs and labels: what every loader returns."""

from __future__ import annotations

from dataclasses import dataclass

import torch


# eq=False: the generated __eq__ would compare tensors element-wise and then fail to truth-test the
# result; identity is the meaningful comparison for these containers.
@dataclass(frozen=True, eq=False)
class TensorSplit:
    """One split of a dataset, held as tensors.

    Attributes
    ----------
    x : torch.Tensor
        Inputs, float32, shape ``(N, *input_shape)``.
    y : torch.Tensor
        Class labels, int64, shape ``(N,)``.
    """

    x: torch.Tensor
    y: torch.Tensor

    def __post_init__(self) -> None:
        if self.x.shape[0] != self.y.shape[0]:
            raise ValueError(
                f"TensorSplit needs one label per input: found {self.x.shape[0]} inputs and "
                f"{self.y.shape[0]} labels"
            )

    def __len__(self) -> int:
        return int(self.y.shape[0])


@dataclass(frozen=True, eq=False)
class DatasetSplits:
    """A dataset's train and test splits with what a model needs to know about them.

    Attributes
    ----------
    name : str
        The dataset's name (a registered one, or a user's ``module:function``).
    train, test : TensorSplit
        The splits; inputs are normalised with training statistics only.
    num_classes : int
        Number of classes; labels lie in ``range(num_classes)``.
    input_shape : tuple of int
        Shape of one input sample, e.g. ``(1, 28, 28)``.
    """

    name: str
    train: TensorSplit
    test: TensorSplit
    num_classes: int
    input_shape: tuple[int, ...]
