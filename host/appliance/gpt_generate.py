"""``wse generate RUN --prompt TEXT``: sample text from a GPT run's checkpoint.

The run's latest checkpoint (or ``--checkpoint DIR``) gives the weights
MemoryX held; the run's settings give the job file, the corpus and the
layout. The model is rebuilt from the job file and captured again, and the
functional model of its float order (the one that trained it) computes the
logits of each next character. The prompt is encoded with the corpus's
vocabulary; the last ``CONTEXT`` characters are the window (a shorter one is
padded on the right: the model is causal, so the padding cannot change the
logits at the prompt's last position). Characters are drawn from
``softmax(logits / temperature)`` with ``numpy.random.default_rng(seed)``:
the same run, prompt and seed give the same text.

Usage::

    wse generate runs/char_gpt --prompt "The return statement" --tokens 300 --seed 0
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

from wse.config import UsageError

from .checkpoint import latest_checkpoint, load_checkpoint
from .gpt import GptLayout, gpt_model
from .job import TEXT_DATASETS, load_job
from .options import Settings

__all__ = ["main", "generate", "Generator"]



def _checkpoint_folder(run: Path, checkpoint: str | Path) -> Path:
    """``--checkpoint``: a folder as given, else the checkpoint of that name in ``run``'s ``checkpoints``."""
    given = Path(checkpoint)
    inside = run / "checkpoints" / given
    return inside if not given.exists() and not given.is_absolute() and inside.exists() else given

class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise UsageError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="wse generate", description="Sample text from a GPT run's checkpoint "
                     "(the functional model of the transformer's float order).")
    parser.add_argument("run", metavar="RUN", help="the run folder of `wse train` of a GPT job (e.g. runs/char_gpt)")
    parser.add_argument("--prompt", required=True, help="the text to continue (characters of the corpus)")
    parser.add_argument("--tokens", type=int, default=200, metavar="N", help="characters to generate (default 200)")
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="sampling seed (default 0)")
    parser.add_argument("--temperature", type=float, default=0.8, metavar="T",
                        help="softmax temperature (default 0.8; smaller is more conservative)")
    parser.add_argument("--checkpoint", metavar="DIR", help="a checkpoint folder of RUN (default: the latest)")
    return parser


class Generator:
    """A GPT run's model at one checkpoint, ready to sample (see the module notes).

    Raises
    ------
    UsageError
        If ``run`` is not a run folder of a GPT job with a checkpoint, or its
        job file no longer builds the model the checkpoint holds.
    """

    def __init__(self, run: str | Path, checkpoint: str | Path | None = None):
        from wse.host.runtime.transformer_reference import TransformerReference

        run = Path(run)
        if not run.is_dir():
            raise UsageError(f"run folder {str(run)!r} does not exist; expected the --out folder of `wse train` "
                             "of a GPT job (e.g. runs/char_gpt)")
        folder = _checkpoint_folder(run, checkpoint) if checkpoint is not None else latest_checkpoint(run)
        if folder is None:
            raise UsageError(f"run folder {str(run)!r} has no checkpoint; train it first "
                             f"(wse train examples/char_gpt.py --out {run})")
        trainer, memoryx = load_checkpoint(folder)
        settings = Settings.from_dict(trainer.get("settings"))
        if settings.dataset not in TEXT_DATASETS:
            raise UsageError(f"checkpoint {str(folder)!r} is of a run on {settings.dataset}, not on text: wse generate samples "
                             "from a GPT run (a job on " + ", ".join(TEXT_DATASETS) + ")")
        self.job = load_job(settings.example)
        from wse.host.data import load_text_corpus

        self.corpus = load_text_corpus(settings.dataset)
        _, graph, _ = gpt_model(self.job, self.corpus, settings.seed)
        held = {name: tuple(memoryx.shape(name)) for name in memoryx.names()}
        if held != {name: tuple(shape) for name, shape in graph.parameters().items()}:
            raise UsageError(f"the checkpoint {str(folder)!r} holds tensors {held}, but {self.job.path.name} now "
                             f"builds {graph.parameters()}; the job file changed since the run")
        self.weights = {name: memoryx.weight(name) for name in memoryx.names()}
        self.reference = TransformerReference(graph, rows=GptLayout.of(settings, self.job.context).rows)
        self.checkpoint, self.step = folder, int(trainer["step"])

    def sample(self, prompt: str, tokens: int, seed: int = 0, temperature: float = 0.8) -> str:
        """``tokens`` characters that continue ``prompt``."""
        if not isinstance(prompt, str) or not prompt:
            raise UsageError("--prompt must be at least one character of text")
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise UsageError(f"--tokens must be a positive integer, not {tokens!r}")
        if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
            raise UsageError(f"--temperature must be a positive number, not {temperature!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise UsageError(f"--seed must be a non-negative integer, not {seed!r}")
        ids = list(self.corpus.encode(prompt))
        rng, context, out = np.random.default_rng(seed), self.job.context, []
        for _ in range(tokens):
            window = ids[-context:]
            row = np.zeros((1, context), dtype=np.int64)
            row[0, :len(window)] = window
            logits = self.reference.logits(self.weights, row)[0, len(window) - 1].astype(np.float64) / temperature
            p = np.exp(logits - logits.max())
            ids.append(int(rng.choice(len(p), p=p / p.sum())))
            out.append(ids[-1])
        return self.corpus.decode(out)


def generate(run: str | Path, prompt: str, tokens: int = 200, seed: int = 0, temperature: float = 0.8,
             checkpoint: str | Path | None = None) -> str:
    """The text ``wse generate`` prints after the prompt (see :class:`Generator`)."""
    return Generator(run, checkpoint).sample(prompt, tokens, seed, temperature)


def main(argv: list[str] | None = None) -> int:
    """Run ``wse generate`` with ``argv``; prints the prompt and its continuation. Exit code 0;
    a :class:`UsageError` propagates to the ``wse`` command (one line, exit code 2)."""
    argv = list(sys.argv[2:] if argv is None else argv)
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:      # --help
        return int(exc.code or 0)
    text = generate(args.run, args.prompt, args.tokens, args.seed, args.temperature, args.checkpoint)
    print(args.prompt + text)
    return 0
