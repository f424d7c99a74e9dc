"""The fabric trains like PyTorch: per-step losses and final accuracy against the plain-PyTorch reference.

Same job file, initial weights, data order and optimizer on both sides; only the arithmetic differs
(the fabric's binary32 order of operations against PyTorch's CPU kernels). The default suite runs the
8x8 digits on a 4x4 mesh; the slow ones run FC-MNIST on 16x16 and the golden backend on a tiny mesh.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from wse.host.appliance import TrainConfig, run_reference, train
from wse.host.appliance import checkpoint as ckpt

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "fc_mnist.py"
LOSS_RTOL = 1e-4
ACCURACY_POINTS = 0.01


def run_both(config: TrainConfig):
    return train(config), run_reference(config)


def step_losses(run_dir: Path) -> list[float]:
    trainer, _ = ckpt.load_checkpoint(ckpt.latest_checkpoint(run_dir))
    return trainer["history"]["loss"]


def check_agreement(summary, reference, run_dir, steps=50):
    fabric = step_losses(run_dir)
    assert len(fabric) == len(reference.losses) == summary.steps
    first = np.array(fabric[:steps]), np.array(reference.losses[:steps])
    worst = np.max(np.abs(first[0] - first[1]) / np.abs(first[1]))
    assert worst <= LOSS_RTOL, f"step losses differ by {worst:.2e} relative"
    assert abs(summary.test_accuracy - reference.test_accuracy) <= ACCURACY_POINTS + 1e-12
    return worst


def test_digits_on_4x4_agrees_with_pytorch(tmp_path):
    config = TrainConfig(EXAMPLE, out=tmp_path / "run", dataset="digits", mesh="4x4", batch=32, epochs=2,
                         progress="none", tensorboard=False)
    summary, reference = run_both(config)
    check_agreement(summary, reference, tmp_path / "run")
    assert summary.test_accuracy > 0.7 and summary.cycles_per_step > 0


def test_resume_on_the_functional_backend_is_bit_exact(tmp_path):
    base = dict(example=EXAMPLE, dataset="digits", mesh="4x4", batch=32, epochs=2, optimizer="adam", lr=0.003,
                progress="none", tensorboard=False)
    train(TrainConfig(out=tmp_path / "straight", max_steps=50, **base))
    train(TrainConfig(out=tmp_path / "split", max_steps=29, **base))
    train(TrainConfig(out=tmp_path / "split", resume=True, max_steps=50, **base))
    _, a = ckpt.load_checkpoint(ckpt.latest_checkpoint(tmp_path / "straight"))
    _, b = ckpt.load_checkpoint(ckpt.latest_checkpoint(tmp_path / "split"))
    for name in a.names():
        assert np.array_equal(a.weight(name), b.weight(name)), name
    assert step_losses(tmp_path / "straight") == step_losses(tmp_path / "split")


@pytest.mark.slow
def test_fc_mnist_on_16x16_agrees_with_pytorch(tmp_path):
    config = TrainConfig(EXAMPLE, out=tmp_path / "run", mesh="16x16", batch=64, epochs=3, progress="none",
                         tensorboard=False)
    summary, reference = run_both(config)
    check_agreement(summary, reference, tmp_path / "run")
    assert summary.test_accuracy >= 0.9


TINY_JOB = """
from torch import nn
DATASET = "digits"
def model(in_features, classes):
    return nn.Sequential(nn.Linear(in_features, 16), nn.ReLU(), nn.Linear(16, classes))
"""


@pytest.mark.slow
def test_golden_backend_matches_functional_on_a_tiny_mesh(tmp_path):
    """The golden fabric model and the functional backend: the same steps, bit for bit, and the same cycles."""
    job = tmp_path / "tiny.py"
    job.write_text(TINY_JOB)
    base = dict(example=job, mesh="2x2", batch=4, max_steps=3, progress="none", tensorboard=False,
                eval_train=False)
    golden = train(TrainConfig(out=tmp_path / "golden", backend="golden", **base))
    functional = train(TrainConfig(out=tmp_path / "functional", backend="functional", **base))
    assert golden.cycles_per_step == functional.cycles_per_step > 0
    assert golden.fmac_utilization == functional.fmac_utilization
    assert step_losses(tmp_path / "golden") == step_losses(tmp_path / "functional")
    assert golden.test_accuracy == functional.test_accuracy and golden.test_loss == functional.test_loss
    _, a = ckpt.load_checkpoint(ckpt.latest_checkpoint(tmp_path / "golden"))
    _, b = ckpt.load_checkpoint(ckpt.latest_checkpoint(tmp_path / "functional"))
    for name in a.names():
        assert np.array_equal(a.weight(name), b.weight(name)), name
