"""The models the examples, tests and benchmarks train.

* :class:`MLP`: a plain multilayer perceptron given by its layer widths. :data:`BENCHMARK_MLP`
  is the benchmark model (1.86 M parameters, 7.5 MB of float32 gradients per step): what
  ``--model mlp`` builds for 784 features and 10 classes.
* :class:`FFNet`: the MLP with its depth and width as knobs, the model used to show how training
  time grows with model size (one hidden layer in, ``num_hl`` more, one out).
* :class:`SimpleNet`: ``784-256-256-10`` with dropout 0.2 after each hidden layer.
* :class:`LeNet`: two convolutions and three linear layers in the shape of LeCun et al. (1998),
  shrunk to fit the 8x8 digits (padding keeps the feature maps from vanishing).

Every model flattens its input itself, so one dataset tensor of shape ``(N, 1, 8, 8)`` feeds
any of them. :func:`build_model` makes one by name for a dataset's input shape.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

MLP_HIDDEN = (1024, 1024)  # the hidden widths of --model mlp
BENCHMARK_MLP = (784, *MLP_HIDDEN, 10)  # --model mlp on 784 features and 10 classes (blobs)


class MLP(nn.Module):
    """Linear layers of the given widths, ReLU between them, optional dropout after each hidden one."""

    def __init__(self, sizes: tuple[int, ...] = BENCHMARK_MLP, dropout: float = 0.0):
        super().__init__()
        if len(sizes) < 2:
            raise ValueError(f"an MLP needs at least an input and an output width, got {list(sizes)}")
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=True))
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = x.flatten(1)
        for layer in self.layers[:-1]:
            z = self.dropout(F.relu(layer(z)))
        return self.layers[-1](z)


class FFNet(MLP):
    """``input_size -> hl_size -> (num_hl x hl_size) -> num_outputs`` with ReLU in between."""

    def __init__(self, input_size: int = 100, num_hl: int = 0, hl_size: int = 10, num_outputs: int = 1):
        super().__init__((input_size, *[hl_size] * (num_hl + 1), num_outputs))


class SimpleNet(MLP):
    """``input_dim -> 256 -> 256 -> num_classes``, dropout 0.2 after each hidden layer."""

    def __init__(self, input_dim: int = 784, hidden_dim: int = 256, num_classes: int = 10):
        super().__init__((input_dim, hidden_dim, hidden_dim, num_classes), dropout=0.2)


class LeNet(nn.Module):
    """conv(6) -> pool -> conv(16) -> pool -> 120 -> 84 -> classes, for square one-channel images."""

    def __init__(self, side: int = 8, num_classes: int = 10):
        super().__init__()
        self.side = side
        self.conv1 = nn.Conv2d(1, 6, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(6, 16, kernel_size=3, padding=1)
        pooled = side // 4  # two 2x2 poolings
        self.fc1 = nn.Linear(16 * pooled * pooled, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = x.reshape(-1, 1, self.side, self.side)
        z = F.max_pool2d(F.relu(self.conv1(z)), 2)
        z = F.max_pool2d(F.relu(self.conv2(z)), 2)
        z = F.relu(self.fc1(z.flatten(1)))
        return self.fc3(F.relu(self.fc2(z)))


MODELS = ("ffnet", "mlp", "simplenet", "lenet")


def build_model(name: str, input_shape: tuple[int, ...], num_outputs: int) -> nn.Module:
    """The model ``name`` for inputs of ``input_shape`` (one sample) and ``num_outputs`` outputs."""
    features = math.prod(input_shape)
    if name == "ffnet":
        return FFNet(features, num_hl=2, hl_size=64, num_outputs=num_outputs)
    if name == "mlp":
        return MLP((features, *MLP_HIDDEN, num_outputs))
    if name == "simplenet":
        return SimpleNet(features, num_classes=num_outputs)
    if name == "lenet":
        # Convolutions need neighbouring pixels: a flat feature vector is refused, not guessed into a square.
        image = input_shape[-2:] if len(input_shape) in (2, 3) and input_shape[:-2] in ((), (1,)) else None
        if image is None or image[0] != image[1] or image[0] < 4:
            raise ValueError(
                f"--model lenet needs square one-channel images, samples of shape (1, H, H) or (H, H) with "
                f"H >= 4; these samples have shape {tuple(input_shape)} (use ffnet, mlp or simplenet)"
            )
        return LeNet(image[0], num_outputs)
    raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")


def check_input(model: nn.Module, x: torch.Tensor, name: str) -> None:
    """Run two samples of ``x`` through ``model`` (no gradient, dropout off), so that inputs the model
    cannot take fail here, in one line, rather than in the first training step on every rank."""
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(x[:2])
    except RuntimeError as e:
        raise ValueError(
            f"--model {name} cannot take samples of shape {tuple(x.shape[1:])}: {str(e).splitlines()[0]}"
        ) from None
    finally:
        model.train(training)
