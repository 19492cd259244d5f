"""Stand-in for ``torchvision`` in the seed listings: MNIST made from scikit-learn's digits.

A listing keeps its ``torchvision.datasets.MNIST(...)`` and ``torchvision.transforms``
lines; only its import becomes ``import digits_as_mnist as torchvision``.  Nothing is
downloaded: the 8x8 digits (bundled with scikit-learn) are scaled to 20x20 and centred
on a 28x28 canvas as MNIST's digits are, as 8-bit grey images; the training set repeats
the training digits to ``TRAIN_LENGTH`` samples, the test set the held-out digits to
``TEST_LENGTH``, enough for the listings' combined batches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F

TRAIN_LENGTH = 8000
TEST_LENGTH = 1600
HELD_OUT = 360  # the last digits form the test set


def _images() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    small = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    scaled = F.interpolate(small, size=(20, 20), mode="bilinear", align_corners=False)
    canvas = F.pad(scaled, (4, 4, 4, 4))
    pixels = (canvas.clamp(0, 1) * 255).round().to(torch.uint8).squeeze(1)
    return pixels, torch.tensor(digits.target, dtype=torch.long)


class MNIST(torch.utils.data.Dataset[tuple[Any, int]]):
    """``torchvision.datasets.MNIST``'s signature; ``root`` and ``download`` are unused."""

    def __init__(
        self,
        root: str,
        train: bool = True,
        download: bool = False,
        transform: Callable[[Any], Any] | None = None,
    ) -> None:
        pixels, labels = _images()
        if train:
            pixels, labels, length = pixels[:-HELD_OUT], labels[:-HELD_OUT], TRAIN_LENGTH
        else:
            pixels, labels, length = pixels[-HELD_OUT:], labels[-HELD_OUT:], TEST_LENGTH
        self._pixels, self._labels, self._length = pixels, labels, length
        self._transform = transform

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> tuple[Any, int]:
        i = index % len(self._labels)
        image: Any = self._pixels[i]
        if self._transform is not None:
            image = self._transform(image)
        return image, int(self._labels[i])


class ToTensor:
    """An 8-bit HxW image to a float ``1xHxW`` tensor in [0, 1]."""

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return image.to(torch.float32).div(255).unsqueeze(0)


class Normalize:
    """``(x - mean) / std`` per channel."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


class Compose:
    """Apply the transforms in order."""

    def __init__(self, transforms: Sequence[Callable[[Any], Any]]) -> None:
        self.transforms = list(transforms)

    def __call__(self, x: Any) -> Any:
        for t in self.transforms:
            x = t(x)
        return x


datasets = SimpleNamespace(MNIST=MNIST)
transforms = SimpleNamespace(ToTensor=ToTensor, Normalize=Normalize, Compose=Compose)
