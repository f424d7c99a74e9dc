"""The GPT's functional model against plain PyTorch on the CPU: step time and loss agreement.

Captures ``examples/char_gpt.py`` (2 layers, d_model 64, 4 heads, context 32)
on the ``pydoc`` corpus and trains it with SGD on the same batches two ways in
one process: the functional model (``TransformerReference``: the reference
operations in the fabric's binary32 orders, numpy) and PyTorch fp32
(forward, backward, ``torch.optim.SGD``, one thread). Steps alternate between
the two sides so that machine load reaches both alike. Prints one JSON line
per step (both losses, their relative difference) and a summary: the median
step times, their ratio (the functional model to PyTorch), the largest
relative loss difference (target: at most 1e-5) and the corpus's unigram
entropy in nats per character.

    .venv/bin/python bench/gpt_reference.py [--steps 10] [--batch 16] [--lr 0.1]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from wse.host.compiler.transformer_capture import capture
from wse.host.data import load_text_corpus
from wse.host.runtime.transformer_reference import TransformerReference

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "char_gpt.py"


def main() -> None:
    """Run the comparison and print JSON lines."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=16, help="sequences per step (default 16)")
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    spec = importlib.util.spec_from_file_location("char_gpt", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    corpus = load_text_corpus()
    x, y = corpus.sequences("train", example.CONTEXT)
    order = np.random.default_rng(0).permutation(len(x))
    torch.manual_seed(0)
    model = example.model(corpus.vocab_size)
    reference = TransformerReference(capture(model, torch.from_numpy(x[:args.batch])))
    params = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    ours_s, theirs_s, worst = [], [], 0.0
    for step in range(args.steps):
        index = order[step * args.batch:(step + 1) * args.batch]
        xb, yb = x[index], y[index]
        start = time.perf_counter()
        result = reference.step(params, xb, yb)
        for key, grad in result.grads.items():
            params[key] = params[key] - np.float32(args.lr) * grad
        ours_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        optimizer.zero_grad()
        logits = model(torch.from_numpy(xb))
        loss = F.cross_entropy(logits.reshape(-1, corpus.vocab_size), torch.from_numpy(yb).reshape(-1))
        loss.backward()
        optimizer.step()
        theirs_s.append(time.perf_counter() - start)
        rel = abs(result.loss - loss.item()) / loss.item()
        worst = max(worst, rel)
        print(json.dumps({"step": step, "loss": result.loss, "torch_loss": loss.item(), "rel_diff": rel}),
              flush=True)
    ours, theirs = statistics.median(ours_s), statistics.median(theirs_s)
    print(json.dumps({"summary": True, "steps": args.steps, "tokens_per_step": args.batch * example.CONTEXT,
                      "functional_step_s": round(ours, 4), "torch_step_s": round(theirs, 4),
                      "ratio": round(ours / theirs, 1), "max_rel_loss_diff": worst, "target_rel": 1e-5,
                      "unigram_entropy_nats": round(corpus.unigram_entropy(), 4)}), flush=True)


if __name__ == "__main__":
    main()
