"""The multilayer perceptrons the compiler tests build: ``mlp(784, 256, 10)`` is
``Linear(784, 256), ReLU, Linear(256, 10)`` (a ReLU after every layer but the last)."""

from torch import nn


def mlp(*sizes: int) -> nn.Sequential:
    """Linear layers of ``sizes[i] -> sizes[i + 1]`` with a ReLU between each two."""
    layers = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)
