"""The run folder against a failing file system: full disks, unwritable folders, a second run, leftovers.

Each case runs ``wse train`` (its ``main``) on a small real job and checks the contract: one line on stderr
naming the path and what it needs, exit code 2, every checkpointed step still loadable, no temporary left.
Where the test may mount a small ``tmpfs`` (root on Linux) the disk is really full or read-only; the
injected ``OSError`` variants run everywhere.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from wse.host.appliance import checkpoint as ckpt
from wse.host.appliance import folder, loop
from wse.host.appliance.cli import main
from wse.host.memoryx import checkpoint as mx_checkpoint
from wse.host.memoryx import tiered

JOB = textwrap.dedent("""\
    from torch import nn
    DATASET = "digits"
    OPTIMIZER = {"name": "adam", "lr": 0.01}
    BATCH = 32
    EPOCHS = 1
    def model(in_features, classes):
        return nn.Sequential(nn.Linear(in_features, 64), nn.ReLU(), nn.Linear(64, classes))
    """)


@pytest.fixture
def job(tmp_path) -> Path:
    path = tmp_path / "job.py"
    path.write_text(JOB)
    return path


def wse_train(job: Path, out: Path, *args: str) -> int:
    return main([str(job), "--mesh", "4x4", "--out", str(out), "--progress", "none", "--no-tensorboard",
                 "--no-train-eval", *args])


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("wse train: ") and "Traceback" not in err, err
    return lines[0]


def leftovers(out: Path) -> list[str]:
    """Temporaries anywhere in a run folder, and a disk tier left behind."""
    if not out.exists():
        return []
    found = [str(p.relative_to(out)) for p in out.rglob(".*") if p.name.endswith((".tmp", ".old"))]
    return found + ([folder.SCRATCH_DIR] if (out / folder.SCRATCH_DIR).exists() else [])


def steps_loadable(out: Path) -> list[int]:
    """The steps of every checkpoint under its final name, each loaded in full."""
    steps = []
    for path in sorted((out / ckpt.CHECKPOINTS).glob("step-*")):
        trainer, memoryx = ckpt.load_checkpoint(path)
        assert memoryx.names()
        steps.append(trainer["step"])
    return steps


@contextlib.contextmanager
def tmpfs(path: Path, size: str, *options: str):
    """A fresh tmpfs of ``size`` at ``path``; skips the test where mounting is not permitted."""
    path.mkdir(parents=True, exist_ok=True)
    opts = ",".join((f"size={size}", *options))
    if sys.platform != "linux" or os.geteuid() != 0 or \
            subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs is not permitted here")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(path: Path, leave: int) -> None:
    """Take all but ``leave`` bytes of the file system of ``path``."""
    free = os.statvfs(path).f_bavail * os.statvfs(path).f_frsize
    if free > leave:
        fd = os.open(path / "filler", os.O_RDWR | os.O_CREAT)
        os.posix_fallocate(fd, 0, free - leave)
        os.close(fd)


# ----------------------------------------------------------------------------- the disk tier
def test_tier_that_does_not_fit_tmpfs(job, tmp_path, capsys):
    with tmpfs(tmp_path / "disk", "32k") as disk:
        assert wse_train(job, disk / "run", "--memoryx-budget", "0") == 2
        line = one_line(capsys)
        assert f"{disk / 'run' / folder.SCRATCH_DIR}" in line and "needs 57,736 bytes" in line
        assert not (disk / "run").exists()          # nothing written


def test_tier_reservation_fails_injected(job, tmp_path, capsys, monkeypatch):
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    out = tmp_path / "run"
    assert wse_train(job, out, "--memoryx-budget", "1K") == 2
    line = one_line(capsys)
    assert f"cannot reserve the MemoryX disk tier in '{out / folder.SCRATCH_DIR / 'system-0'}'" in line
    assert "No space left on device; it needs 56,832 bytes of free space" in line
    assert leftovers(out) == [] and steps_loadable(out) == []


def test_tier_folder_read_only_or_a_file(job, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    assert wse_train(job, out, "--max-steps", "2") == 0
    capsys.readouterr()
    (out / folder.SCRATCH_DIR).write_text("not a folder")
    assert wse_train(job, out, "--resume", "--memoryx-budget", "0") == 2
    assert f"'{out / folder.SCRATCH_DIR}' is a file; expected the MemoryX disk tier folder" in one_line(capsys)
    (out / folder.SCRATCH_DIR).unlink()

    def read_only(fd, nbytes):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(tiered, "allocate", read_only)
    assert wse_train(job, out, "--resume", "--memoryx-budget", "0") == 2
    assert "Read-only file system; it needs a writable file system" in one_line(capsys)
    assert leftovers(out) == [] and steps_loadable(out) == [2]


# ----------------------------------------------------------------------------- checkpoints on a full disk
def _fill_after(monkeypatch, checkpoints: int, leave: int, disk: Path) -> None:
    """Fill ``disk`` but ``leave`` bytes once ``checkpoints`` checkpoints were written."""
    real, count = loop.save_checkpoint, [0]

    def save(*args, **kwargs):
        result = real(*args, **kwargs)
        count[0] += 1
        if count[0] == checkpoints:
            fill(disk, leave)
        return result

    monkeypatch.setattr(loop, "save_checkpoint", save)


def _continue_elsewhere(job, out: Path, tmp_path: Path, capsys) -> None:
    """The stopped run, copied to a roomy disk, resumes to the bits of a run never stopped."""
    import shutil

    moved = tmp_path / "moved"
    shutil.copytree(out, moved)
    assert wse_train(job, moved, "--resume", "--max-steps", "6") == 0
    assert wse_train(job, tmp_path / "straight", "--max-steps", "6") == 0
    capsys.readouterr()
    a = ckpt.load_checkpoint(ckpt.latest_checkpoint(moved))[1]
    b = ckpt.load_checkpoint(ckpt.latest_checkpoint(tmp_path / "straight"))[1]
    for name in a.names():
        assert np.array_equal(a.weight(name).view(np.uint32), b.weight(name).view(np.uint32))


@pytest.mark.parametrize("checked", [True, False], ids=["refused-up-front", "fails-mid-write"])
def test_checkpoint_on_a_full_tmpfs(job, tmp_path, capsys, monkeypatch, checked):
    with tmpfs(tmp_path / "disk", "1m") as disk:
        out = disk / "run"
        _fill_after(monkeypatch, 2, 24 << 10, disk)
        if not checked:         # the file system said there was room; the write itself meets the full disk
            monkeypatch.setattr(mx_checkpoint, "free_bytes", lambda path: None)
        assert wse_train(job, out, "--checkpoint-every", "1", "--max-steps", "6") == 2
        line = one_line(capsys)
        assert line.startswith(f"wse train: cannot write a checkpoint to '{out / ckpt.CHECKPOINTS}': ")
        assert "No space left on device; it needs" in line and "bytes of free space" in line
        assert line.endswith("the run stopped before step-00000003: checkpoint step-00000002 is intact; "
                             "resume from it with --resume")
        assert leftovers(out) == [] and steps_loadable(out) == [1, 2]
        os.unlink(disk / "filler")
        _continue_elsewhere(job, out, tmp_path, capsys)


def test_checkpoint_on_a_full_disk_injected(job, tmp_path, capsys, monkeypatch):
    real, count = mx_checkpoint.safetensors.numpy.save_file, [0]

    def save_file(tensors, filename, metadata=None):
        count[0] += 1
        if count[0] < 3:
            return real(tensors, filename, metadata)
        Path(filename).write_bytes(b"\0" * 100)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(mx_checkpoint.safetensors.numpy, "save_file", save_file)
    out = tmp_path / "run"
    assert wse_train(job, out, "--checkpoint-every", "1", "--max-steps", "6") == 2
    line = one_line(capsys)
    assert line.startswith(f"wse train: cannot write a checkpoint to '{out / ckpt.CHECKPOINTS}': ")
    assert "No space left on device; it needs" in line and "checkpoint step-00000002 is intact" in line
    assert leftovers(out) == [] and steps_loadable(out) == [1, 2]
    monkeypatch.undo()
    _continue_elsewhere(job, out, tmp_path, capsys)


# ----------------------------------------------------------------------------- unwritable run folders
def test_out_on_a_read_only_tmpfs(job, tmp_path, capsys):
    with tmpfs(tmp_path / "ro", "64k", "ro") as disk:
        assert wse_train(job, disk / "run") == 2
        line = one_line(capsys)
        assert f"--out '{disk / 'run'}' cannot be written: '{disk}' is on a read-only file system" in line


def test_out_not_writable_injected(job, tmp_path, capsys, monkeypatch):
    (tmp_path / "file").write_text("x")
    assert wse_train(job, tmp_path / "file" / "run") == 2
    assert f"'{tmp_path / 'file'}' is a file; expected a folder" in one_line(capsys)
    real_mkdir = Path.mkdir

    def mkdir(self, *args, **kwargs):
        if self.name == "run":
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    assert wse_train(job, tmp_path / "run") == 2
    line = one_line(capsys)
    assert f"cannot create run folder '{tmp_path / 'run'}': Read-only file system" in line
    assert line.endswith("it needs a writable file system") and not (tmp_path / "run").exists()


def test_a_write_failing_after_the_start_is_one_line(job, tmp_path, capsys, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "run" / "summary.json"))

    monkeypatch.setattr(loop, "finish_run", full)
    assert wse_train(job, tmp_path / "run", "--max-steps", "2") == 2
    line = one_line(capsys)
    assert f"cannot write '{tmp_path / 'run' / 'summary.json'}': No space left on device" in line
    assert steps_loadable(tmp_path / "run") == [2]


# ----------------------------------------------------------------------------- the lock
def test_a_second_run_on_a_live_folder_is_refused(job, tmp_path, capsys):
    out = tmp_path / "run"
    assert wse_train(job, out, "--max-steps", "2") == 0
    capsys.readouterr()
    before = sorted(p.name for p in out.iterdir())
    lock = folder.RunLock.acquire(out)            # a live run holds it (another descriptor: flock refuses)
    try:
        for args in ([], ["--resume"], ["--overwrite"]):
            assert wse_train(job, out, *args) == 2
            line = one_line(capsys)
            assert f"run folder '{out}' is in use by another run (pid {os.getpid()} on host " in line, line
        assert sorted(p.name for p in out.iterdir()) == before and steps_loadable(out) == [2]
    finally:
        lock.release()
    assert wse_train(job, out, "--overwrite", "--max-steps", "1") == 0
    assert steps_loadable(out) == [1]


def test_a_stale_lock_of_a_dead_process_is_no_obstacle(job, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / folder.LOCK_NAME).write_text("999999 elsewhere 0\n")      # its process is gone: no flock held
    assert wse_train(job, out, "--max-steps", "1") == 0
    assert (out / folder.LOCK_NAME).read_text().split()[0] == str(os.getpid())
    folder.RunLock.acquire(out).release()        # released at the end of the run


@pytest.mark.slow
def test_two_processes_on_one_folder(job, tmp_path):
    out = tmp_path / "run"
    command = [sys.executable, "-m", "wse", "train", str(job), "--mesh", "4x4", "--out", str(out),
               "--progress", "none", "--no-tensorboard", "--no-train-eval", "--checkpoint-every", "1"]
    runs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(run.wait(), run.stderr.read()) for run in runs]
    assert sorted(code for code, _ in results) == [0, 2], results
    err = next(text for code, text in results if code == 2)
    assert len(err.strip().splitlines()) == 1 and ("is in use by another run" in err or "is not empty" in err)
    assert steps_loadable(out)[-1] == 44 and leftovers(out) == []


# ----------------------------------------------------------------------------- leftovers of killed runs
def test_stale_temporaries_are_cleaned_at_start(job, tmp_path, capsys):
    out = tmp_path / "run"
    assert wse_train(job, out, "--checkpoint-every", "1", "--max-steps", "3") == 0
    root = out / ckpt.CHECKPOINTS
    stale = [root / ".latest.abcd.tmp", out / ".summary.json.x1y2.tmp", root / ".step-00000004.77-ab12.tmp",
             root / ".step-00000001.ab12.old"]
    for path in stale[:2]:
        path.write_text("half")
    for path in stale[2:]:
        path.mkdir()
        (path / "trainer.json").write_text("{")
    (root / "step-00000004").mkdir()               # not complete: no trainer.json, no memoryx
    assert ckpt.latest_checkpoint(out).name == "step-00000003"
    assert wse_train(job, out, "--resume", "--max-steps", "4") == 0
    assert leftovers(out) == [] and steps_loadable(out) == [3, 4]


def test_latest_falls_back_to_the_newest_complete_checkpoint(job, tmp_path, capsys):
    out = tmp_path / "run"
    assert wse_train(job, out, "--checkpoint-every", "1", "--max-steps", "3", "--keep-checkpoints", "3") == 0
    root = out / ckpt.CHECKPOINTS
    (root / "latest").write_text("step-00000002\n")          # killed between the rename and the pointer
    assert ckpt.latest_checkpoint(out).name == "step-00000003"
    os.rename(root / "step-00000003", root / ".gone")
    (root / "latest").write_text("step-00000003\n")          # a pointer to a checkpoint that vanished
    assert ckpt.latest_checkpoint(out).name == "step-00000002"
