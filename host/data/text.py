"""A character-level text corpus for language models, with nothing to download.

The corpus is ``pydoc``: the text of Python's interactive help topics
(``pydoc_data.topics``, the statements, operators and data-model chapters of
the language reference that ``help("assert")`` shows), about 465,000
characters of English prose with code examples. It ships with every CPython
in the standard library, so it needs no network, no new dependency and no
file of ours; its words (``the``, ``object``, ``function``, ``statement``)
make generated text easy to judge. It is fixed by the Python version
(:attr:`TextCorpus.source` names it): CPython 3.11.7 here.

Splits: the topics in sorted order, joined by blank lines; the first 90% of
the characters are ``"train"``, the last 10% ``"validation"`` (contiguous,
so no sentence is in both). The vocabulary is every character of the whole
corpus, in code-point order.
"""

from __future__ import annotations

import dataclasses
import functools
import platform

import numpy as np

from wse.config import UsageError

__all__ = ["TEXT_CORPORA", "TEXT_SPLITS", "VALIDATION_FRACTION", "TextCorpus", "load_text_corpus"]

#: The corpora :func:`load_text_corpus` knows, with a description.
TEXT_CORPORA = {"pydoc": "Python's help topics (pydoc_data.topics, ships with Python), ~465k characters"}
#: The split names a corpus accepts.
TEXT_SPLITS = ("train", "validation", "all")
#: Share of the characters, at the end, that form ``"validation"``.
VALIDATION_FRACTION = 0.1


@dataclasses.dataclass(frozen=True)
class TextCorpus:
    """A text as character ids, with its vocabulary and splits.

    Members
    -------
    name:
        The corpus name (a key of :data:`TEXT_CORPORA`).
    text:
        The whole text.
    vocab:
        Its distinct characters in code-point order; id ``i`` is ``vocab[i]``.
    source:
        Where the text comes from (with the Python version that fixes it).
    """

    name: str
    text: str
    vocab: str
    source: str

    @functools.cached_property
    def ids(self) -> np.ndarray:
        """The whole text as int64 character ids."""
        return self.encode(self.text)

    @property
    def vocab_size(self) -> int:
        """Number of distinct characters."""
        return len(self.vocab)

    def encode(self, text: str) -> np.ndarray:
        """Character ids of ``text``; :class:`UsageError` naming the first character outside the vocabulary."""
        index = {c: i for i, c in enumerate(self.vocab)}
        try:
            return np.fromiter((index[c] for c in text), dtype=np.int64, count=len(text))
        except KeyError as exc:
            raise UsageError(f"text contains {exc.args[0]!r}, which is not in the {self.name} corpus's "
                             f"{self.vocab_size}-character vocabulary") from None

    def decode(self, ids) -> str:
        """The text of character ids ``ids``."""
        return "".join(self.vocab[int(i)] for i in np.asarray(ids).reshape(-1))

    def split(self, split: str = "train") -> np.ndarray:
        """The ids of ``"train"`` (first 90%), ``"validation"`` (last 10%) or ``"all"``."""
        if split not in TEXT_SPLITS:
            raise UsageError(f"split must be one of {', '.join(TEXT_SPLITS)}, not {split!r}")
        cut = len(self.text) - int(round(len(self.text) * VALIDATION_FRACTION))
        return {"train": self.ids[:cut], "validation": self.ids[cut:], "all": self.ids}[split]

    def sequences(self, split: str, context: int) -> tuple[np.ndarray, np.ndarray]:
        """Next-token training pairs: ``x[i] = ids[i*T : i*T + T]`` and ``y[i]`` the
        same window one character later, for every whole non-overlapping window
        of the split (``T = context``); both int64 ``[N, T]``."""
        if isinstance(context, bool) or not isinstance(context, int) or context < 1:
            raise UsageError(f"context must be a positive integer, not {context!r}")
        ids = self.split(split)
        count = (len(ids) - 1) // context
        if count < 1:
            raise UsageError(f"the {split} split has {len(ids)} characters, too few for one sequence of "
                             f"{context}")
        x = ids[:count * context].reshape(count, context)
        y = ids[1:count * context + 1].reshape(count, context)
        return x.copy(), y.copy()

    def frequencies(self, split: str = "train") -> np.ndarray:
        """Relative frequency of each character id in ``split`` (float64, sums to 1)."""
        counts = np.bincount(self.split(split), minlength=self.vocab_size).astype(np.float64)
        return counts / counts.sum()

    def unigram_entropy(self, split: str = "train") -> float:
        """Entropy of the characters' distribution in ``split``, in nats per character:
        the loss of the best model that ignores context."""
        p = self.frequencies(split)
        p = p[p > 0]
        return float(-(p * np.log(p)).sum())

    def unigram_validation_loss(self) -> float:
        """Cross-entropy of ``"validation"`` under the training split's character
        frequencies (add-one smoothed, so unseen characters cost finitely), in
        nats per character: what a context-free model scores on validation."""
        counts = np.bincount(self.split("train"), minlength=self.vocab_size).astype(np.float64) + 1.0
        logp = np.log(counts / counts.sum())
        return float(-logp[self.split("validation")].mean())


def _pydoc_text() -> tuple[str, str]:
    try:
        from pydoc_data import topics
    except ImportError:  # a Python built without its help topics
        raise UsageError("the pydoc corpus needs pydoc_data.topics, which this Python does not have "
                         "(it ships with CPython's standard library)") from None
    text = "\n\n".join(topics.topics[key].strip("\n") for key in sorted(topics.topics)) + "\n"
    source = f"pydoc_data.topics of Python {platform.python_version()} ({len(topics.topics)} topics)"
    return text, source


@functools.lru_cache(maxsize=None)
def load_text_corpus(name: str = "pydoc") -> TextCorpus:
    """The text corpus ``name`` (see :data:`TEXT_CORPORA`); nothing is downloaded.

    Raises
    ------
    UsageError
        If ``name`` is not a known corpus.
    """
    if name not in TEXT_CORPORA:
        raise UsageError(f"text corpus must be one of {', '.join(TEXT_CORPORA)}, not {name!r}")
    text, source = _pydoc_text()
    return TextCorpus(name, text, "".join(sorted(set(text))), source)
