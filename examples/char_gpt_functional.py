"""Train examples/char_gpt.py in the fabric's arithmetic on the host, then sample text.

The same training as ``wse train examples/char_gpt.py`` (``docs/transformer.md``
section 10) written out in one page, without the appliance: the front end
captures the model, the functional model
(``wse.host.runtime.transformer_reference.TransformerReference``: every operation in the fabric's
binary32 order) computes each step's loss and gradients, and MemoryX holds
the weights and the Adam state and applies the updates, as in weight
streaming. Prints the training loss, the validation loss on a fixed set of
validation sequences against the corpus's unigram entropy (nats per
character), and a sample continuing a validation prompt.

    .venv/bin/python examples/char_gpt_functional.py [--minutes 5] [--batch 16] [--lr 3e-3]
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

import numpy as np
import torch

from wse.host.compiler.transformer_capture import capture
from wse.host.data import load_text_corpus
from wse.host.memoryx import MemoryX, OptimizerConfig
from wse.host.runtime.loss import cross_entropy
from wse.host.runtime.transformer_reference import TransformerReference

HERE = Path(__file__).resolve().parent


def _example():
    spec = importlib.util.spec_from_file_location("char_gpt", HERE / "char_gpt.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def validation_loss(reference, params, x, y, batch) -> float:
    """Mean next-character loss over the sequences ``x`` (targets ``y``)."""
    losses = []
    for start in range(0, len(x), batch):
        logits = reference.logits(params, x[start:start + batch])
        losses.append(cross_entropy(logits.reshape(-1, logits.shape[-1]), y[start:start + batch].reshape(-1)))
    return float(np.mean(np.concatenate(losses)))


def sample(reference, params, corpus, prompt: str, length: int, temperature: float, seed: int) -> str:
    """Continue ``prompt`` (as long as the context) one character at a time."""
    rng = np.random.default_rng(seed)
    ids = list(corpus.encode(prompt))
    context = len(ids)
    for _ in range(length):
        logits = reference.logits(params, np.array([ids[-context:]]))[0, -1].astype(np.float64) / temperature
        p = np.exp(logits - logits.max())
        ids.append(int(rng.choice(len(p), p=p / p.sum())))
    return corpus.decode(ids[context:])


def main() -> None:
    """Train for a fixed time, report, sample."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="training time budget (default 5)")
    parser.add_argument("--batch", type=int, default=16, help="sequences per step (default 16)")
    parser.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate (default 3e-3)")
    parser.add_argument("--validation", type=int, default=128, help="validation sequences evaluated (default 128)")
    parser.add_argument("--report", type=int, default=50, help="steps between reports (default 50)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    example = _example()
    corpus = load_text_corpus()
    x, y = corpus.sequences("train", example.CONTEXT)
    vx, vy = corpus.sequences("validation", example.CONTEXT)
    pick = np.random.default_rng(1).permutation(len(vx))[:args.validation]
    vx, vy = vx[pick], vy[pick]
    torch.manual_seed(args.seed)
    model = example.model(corpus.vocab_size)
    reference = TransformerReference(capture(model, torch.from_numpy(x[:args.batch])))
    memoryx = MemoryX.from_state_dict(model.state_dict(), OptimizerConfig("adam", lr=args.lr))
    entropy = corpus.unigram_entropy()
    print(f"corpus {corpus.source}: {len(x):,} training sequences of {example.CONTEXT}, "
          f"unigram entropy {entropy:.4f} nats/char; model {reference.graph.parameter_count:,} parameters")
    rng = np.random.default_rng(args.seed)
    order, position, step, start = rng.permutation(len(x)), 0, 0, time.perf_counter()
    recent: list[float] = []
    while time.perf_counter() - start < args.minutes * 60:
        if position + args.batch > len(order):
            order, position = rng.permutation(len(x)), 0
        index = order[position:position + args.batch]
        position += args.batch
        params = {name: memoryx.weight(name) for name in memoryx.names()}
        result = reference.step(params, x[index], y[index])
        memoryx.apply_gradients(result.grads)
        recent.append(result.loss)
        step += 1
        if step % args.report == 0:
            params = {name: memoryx.weight(name) for name in memoryx.names()}
            val = validation_loss(reference, params, vx, vy, args.batch)
            print(f"step {step} ({time.perf_counter() - start:.0f} s): train loss {np.mean(recent):.4f}, "
                  f"validation loss {val:.4f} nats/char (unigram entropy {entropy:.4f})", flush=True)
            recent = []
    params = {name: memoryx.weight(name) for name in memoryx.names()}
    val = validation_loss(reference, params, vx, vy, args.batch)
    print(f"after {step} steps ({time.perf_counter() - start:.0f} s): validation loss {val:.4f} nats/char, "
          f"unigram entropy {entropy:.4f}")
    prompt = corpus.decode(corpus.split("validation")[:example.CONTEXT])
    print(f"sample after {prompt!r}:")
    print(sample(reference, params, corpus, prompt, 300, 0.8, args.seed))


if __name__ == "__main__":
    main()
