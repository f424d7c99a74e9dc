"""The character-level text corpus (wse.host.data.text): no download, a fixed
train/validation split, next-token pairs and the unigram entropy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from wse.config import UsageError
from wse.host.data import TEXT_CORPORA, load_text_corpus


@pytest.fixture(scope="module")
def corpus():
    return load_text_corpus("pydoc")


def test_corpus_ships_with_python(corpus):
    from pydoc_data import topics
    assert "pydoc" in TEXT_CORPORA
    assert len(corpus.text) > 400_000 and corpus.text.startswith(topics.topics[sorted(topics.topics)[0]].strip("\n"))
    assert "Python" in corpus.source
    assert corpus.vocab == "".join(sorted(set(corpus.text))) and 60 <= corpus.vocab_size <= 200
    for word in (" the ", " object", " function", " statement"):
        assert word in corpus.text


def test_split_is_contiguous_and_complete(corpus):
    train, validation = corpus.split("train"), corpus.split("validation")
    assert np.array_equal(np.concatenate([train, validation]), corpus.split("all"))
    assert abs(len(validation) / len(corpus.text) - 0.1) < 1e-4
    assert corpus.decode(train) + corpus.decode(validation) == corpus.text
    with pytest.raises(UsageError, match="split must be one of train, validation, all, not 'test'"):
        corpus.split("test")


def test_sequences_are_next_token_pairs(corpus):
    x, y = corpus.sequences("validation", 32)
    assert x.shape == y.shape and x.shape[1] == 32 and x.dtype == np.int64
    assert x.shape[0] == (len(corpus.split("validation")) - 1) // 32
    assert np.array_equal(x[:, 1:], y[:, :-1])
    assert np.array_equal(y[:-1, -1], x[1:, 0])
    assert corpus.decode(x[0]) == corpus.decode(corpus.split("validation")[:32])
    with pytest.raises(UsageError, match="context must be a positive integer"):
        corpus.sequences("train", 0)


def test_encode_decode_round_trip(corpus):
    sample = corpus.text[1000:1500]
    assert corpus.decode(corpus.encode(sample)) == sample
    with pytest.raises(UsageError, match="not in the pydoc corpus"):
        corpus.encode("\x00")


def test_unigram_entropy(corpus):
    h = corpus.unigram_entropy()
    counts = {}
    for c in corpus.decode(corpus.split("train")):
        counts[c] = counts.get(c, 0) + 1
    total = sum(counts.values())
    expected = -sum(n / total * math.log(n / total) for n in counts.values())
    assert h == pytest.approx(expected, rel=1e-12)
    assert 2.5 < h < math.log(corpus.vocab_size)
    # a context-free model scores about the entropy on validation, never below the validation's own
    assert corpus.unigram_validation_loss() >= corpus.unigram_entropy("validation")
    assert abs(corpus.unigram_validation_loss() - h) < 0.2


def test_unknown_corpus():
    with pytest.raises(UsageError, match="text corpus must be one of pydoc, not 'shakespeare'"):
        load_text_corpus("shakespeare")
