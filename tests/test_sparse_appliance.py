"""``wse train --sparsity`` (``docs/weight_streaming.md`` section 13): the run
trains like PyTorch with gradient masking (``weight.grad *= mask`` after
``backward()``, initial weights masked), the masks live in MemoryX and in
checkpoints as indices, ``--resume`` continues bit for bit, and bad input is
one error line with exit code 2."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from wse.host.appliance import TrainConfig, load_job, resolve_settings, train
from wse.host.appliance import checkpoint as ckpt
from wse.host.appliance.cli import main
from wse.host.appliance.folder import tier_disk_bytes
from wse.host.appliance.preparation import load_run
from wse.host.appliance.sparsity import run_masks
from wse.host.data import Batches
from wse.host.memoryx import MemoryX
from wse.config import UsageError

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "fc_mnist.py"
BASE = dict(dataset="digits", mesh="4x4", batch=32, epochs=2, progress="none", tensorboard=False, eval_train=False)


def pytorch_masked_losses(config: TrainConfig, steps: int) -> list[float]:
    """The same run in PyTorch with gradient masking: weights masked at the start, ``grad *= mask``."""
    job = load_job(config.example)
    settings = resolve_settings(dataclasses.replace(config, overwrite=False, resume=False), job)
    (x, y), _, model = load_run(job, settings)
    masks = {k: torch.from_numpy(v.astype(np.float32)) for k, v in run_masks(model, settings.sparsity).items()}
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, mask in masks.items():
            params[name].mul_(mask)
    optimizer = settings.optimizer_config.build(list(model.parameters()))
    batches = Batches(x, y, settings.batch, seed=settings.seed, drop_last=True)
    losses = []
    for _ in range(steps):
        xb, yb = batches.next_batch()
        loss = F.cross_entropy(model(torch.from_numpy(xb)), torch.from_numpy(yb.astype(np.int64)))
        optimizer.zero_grad()
        loss.backward()
        for name, mask in masks.items():
            params[name].grad.mul_(mask)
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


def fabric_losses(out: Path) -> list[float]:
    trainer, _ = ckpt.load_checkpoint(ckpt.latest_checkpoint(out))
    return trainer["history"]["loss"]


@pytest.mark.parametrize("steps,optimizer", [(12, "sgd"), pytest.param(50, "sgd", marks=pytest.mark.slow),
                                             pytest.param(50, "adam", marks=pytest.mark.slow)])
def test_sparse_run_matches_pytorch_with_gradient_masking(tmp_path, steps, optimizer):
    config = TrainConfig(EXAMPLE, out=tmp_path / "run", max_steps=steps, sparsity=0.75, optimizer=optimizer,
                         lr=0.003 if optimizer == "adam" else None, **BASE)
    summary = train(config)
    fabric, reference = np.array(fabric_losses(tmp_path / "run")), np.array(pytorch_masked_losses(config, steps))
    assert len(fabric) == steps
    worst = np.max(np.abs(fabric - reference) / np.abs(reference))
    assert worst <= 1e-6, f"step losses differ by {worst:.2e} relative"
    fab = summary.data["fabric"]
    assert 0 < fab["cycles_per_step"] < fab["dense_cycles_per_step"]
    assert "sparsity    :" in summary.describe()
    state = summary.data["memoryx_state"]                      # MemoryX's optimizer state: kept weights only
    assert f"optimizer state {state['state_bytes']:,} bytes ({state['dense_state_bytes']:,} dense)" \
        in summary.describe()
    assert state["state_bytes"] < 0.3 * state["dense_state_bytes"]
    _, memoryx = ckpt.load_checkpoint(ckpt.latest_checkpoint(tmp_path / "run"))
    manifest = json.loads(next((tmp_path / "run").glob("checkpoints/*/memoryx/memoryx.json")).read_text())
    assert sorted(manifest["masks"]) == ["fc1.weight", "fc2.weight"]           # the classifier stays dense
    for name, mask in memoryx.masks.items():
        assert manifest["masks"][name] == np.flatnonzero(mask).tolist()       # indices, not a dense mask
        assert abs(mask.mean() - 0.25) < 0.01
        assert np.all(memoryx.weight(name)[~mask] == 0)                       # pruned weights stay zero


@pytest.mark.parametrize("optimizer,budget", [("nesterov", None), ("adam", "0")])
def test_sparse_run_updates_like_dense_state_gradient_masking(tmp_path, monkeypatch, optimizer, budget):
    """MemoryX keeps the optimizer state of the kept weights only; replaying the run's gradients through
    ``torch.optim`` on dense weights and state with gradient masking gives the same bits (a disk tier too)."""
    seen: list = []
    apply = MemoryX.apply_gradients

    def recording(self, grads):
        if not seen:
            seen.append({name: np.array(self.weight(name)) for name in self.names()})
        seen.append({name: np.array(g) for name, g in grads.items()})
        return apply(self, grads)

    monkeypatch.setattr(MemoryX, "apply_gradients", recording)
    example = EXAMPLE
    if optimizer == "nesterov":
        example = tmp_path / "job.py"
        example.write_text(EXAMPLE.read_text() + '\nOPTIMIZER = {"name": "sgd", "lr": 0.05, "momentum": 0.9, '
                           '"nesterov": True, "weight_decay": 0.001}\n')
    extra = dict(optimizer="adam", lr=0.003) if optimizer == "adam" else {}
    train(TrainConfig(example, out=tmp_path / "run", max_steps=8, sparsity=0.75, memoryx_budget=budget,
                      **extra, **BASE))
    _, memoryx = ckpt.load_checkpoint(ckpt.latest_checkpoint(tmp_path / "run"))
    masks = memoryx.masks
    params = {name: torch.from_numpy(value) for name, value in seen[0].items()}
    reference = memoryx.config.build(list(params.values()))
    for grads in seen[1:]:
        for name, param in params.items():
            param.grad = torch.from_numpy(grads[name] * masks.get(name, np.float32(1)))
        reference.step()
    for name, param in params.items():
        mine, dense = memoryx.weight(name).view(np.uint32), param.numpy()
        if name in masks:
            assert np.all(mine[~masks[name]] == 0), name                # pruned weights: exactly +0
            assert all(state.shape in ((), (int(masks[name].sum()),))      # compact state
                       for state in memoryx.optimizer_state(name).values())
            dense = np.where(masks[name], dense, np.float32(0))          # dense state leaves +0 or -0 there
        assert np.array_equal(mine, dense.view(np.uint32)), name
    sizes = memoryx.state_bytes()
    assert sizes["state_bytes"] < 0.4 * sizes["dense_state_bytes"]
    assert tier_disk_bytes(memoryx, 0) == 4 * memoryx.num_elements + sizes["state_bytes"]     # all on disk


def test_sparse_resume_is_bit_exact(tmp_path):
    base = dict(example=EXAMPLE, sparsity=0.8, optimizer="adam", lr=0.003, **BASE)
    train(TrainConfig(out=tmp_path / "straight", max_steps=20, **base))
    train(TrainConfig(out=tmp_path / "split", max_steps=11, **base))
    train(TrainConfig(out=tmp_path / "split", resume=True, max_steps=20, **base))
    _, a = ckpt.load_checkpoint(ckpt.latest_checkpoint(tmp_path / "straight"))
    _, b = ckpt.load_checkpoint(ckpt.latest_checkpoint(tmp_path / "split"))
    for name in a.names():
        assert np.array_equal(a.weight(name), b.weight(name)), name
    assert fabric_losses(tmp_path / "straight") == fabric_losses(tmp_path / "split")


def _cli(*args) -> list[str]:
    return [str(EXAMPLE), "--dataset", "digits", "--mesh", "4x4", "--batch", "32", "--progress", "none",
            "--no-tensorboard", "--no-train-eval", *args]


@pytest.mark.parametrize("value", ["1.0", "-0.1", "1.5"])
def test_sparsity_outside_the_unit_interval_is_one_error_line(tmp_path, capsys, value):
    assert main(_cli("--out", str(tmp_path / "run"), "--sparsity", value)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--sparsity must be a number in [0, 1)" in err[0] and "Traceback" not in err[0]
    assert not (tmp_path / "run").exists()


def test_resuming_with_another_mask_is_refused(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main(_cli("--out", out, "--sparsity", "0.5", "--max-steps", "2")) == 0
    capsys.readouterr()
    assert main(_cli("--out", out, "--sparsity", "0.9", "--resume")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--sparsity" in err[0] and "differs from the run being resumed" in err[0]
    manifest_path = next(Path(out).glob("checkpoints/*/memoryx/memoryx.json"))
    manifest = json.loads(manifest_path.read_text())
    kept = manifest["masks"]["fc1.weight"]
    pruned = next(i for i in range(kept[-1]) if i not in set(kept))
    manifest["masks"]["fc1.weight"] = sorted(kept[1:] + [pruned])   # another mask, as many kept weights
    manifest_path.write_text(json.dumps(manifest))
    assert main(_cli("--out", out, "--resume")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "checkpoint's mask of fc1.weight" in err[0] and "is not the one" in err[0]
    manifest["masks"]["fc1.weight"] = kept[1:]          # fewer kept weights than its compact state holds
    manifest_path.write_text(json.dumps(manifest))
    assert main(_cli("--out", out, "--resume")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"checkpoint's mask of fc1.weight keeps {len(kept) - 1} weights" in err[0]


def test_bad_masks_and_job_sparsity_are_usage_errors(tmp_path, capsys):
    memoryx = MemoryX.from_state_dict({"w": np.ones((2, 3), np.float32)})
    with pytest.raises(UsageError, match="mask of 'w' has shape"):
        memoryx.set_masks({"w": np.ones((3, 2), bool)})
    job = tmp_path / "job.py"
    job.write_text(EXAMPLE.read_text() + '\nSPARSITY = {"sparsity": 0.5, "layers": {"fc9.weight": 0.5}}\n')
    assert main([str(job), *_cli("--out", str(tmp_path / "run"))[1:]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fc9.weight" in err[0] and "no such weight" in err[0]
    job.write_text(EXAMPLE.read_text() + '\nSPARSITY = {"sparsity": 0.5, "method": "blocky"}\n')
    assert main([str(job), *_cli("--out", str(tmp_path / "run"))[1:]]) == 2
    assert "method must be one of magnitude, random" in capsys.readouterr().err
