"""The 3-layer FC-MNIST network, as a job for ``wse train``.

    wse train examples/fc_mnist.py --backend functional --mesh 16x16 --batch 64 --epochs 5

The model is a plain ``torch.nn.Module``: 784 -> 256 -> 256 -> 10, ReLU
between the layers, trained with softmax cross-entropy. ``wse train`` builds
it through ``model()`` (seeded by ``--seed``) and reads the defaults below;
command-line options override them. With ``--dataset digits`` the same
network takes 8x8 images (64 inputs).
"""

from torch import nn

#: Hidden layer widths.
HIDDEN = (256, 256)

DATASET = "mnist"
OPTIMIZER = {"name": "sgd", "lr": 0.05, "momentum": 0.9}
BATCH = 64
EPOCHS = 5


class FCMNIST(nn.Module):
    """Fully connected classifier: ``in_features -> hidden[0] -> hidden[1] -> classes``."""

    def __init__(self, in_features: int = 784, hidden: tuple[int, int] = HIDDEN, classes: int = 10):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden[0])
        self.fc2 = nn.Linear(hidden[0], hidden[1])
        self.fc3 = nn.Linear(hidden[1], classes)
        self.relu = nn.ReLU()

    def forward(self, x):
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        return self.fc3(x)


def model(in_features: int, classes: int) -> nn.Module:
    """The network for samples of ``in_features`` pixels and ``classes`` classes."""
    return FCMNIST(in_features, HIDDEN, classes)
