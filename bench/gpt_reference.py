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

With ``--validation`` it measures the validation loss after a fixed budget
instead: both sides train from the same initial weights on the same batches
with Adam (``examples/char_gpt.py``'s optimizer, lr 3e-3: MemoryX's Adam for
the functional model, ``torch.optim.Adam`` for PyTorch), and every
``--report`` steps and at the end both are evaluated on the same fixed
validation sequences (the mean next-character loss, nats per character). One
JSON line per evaluation and a summary with the relative difference of the
final validation losses (target: at most 1%).

    .venv/bin/python bench/gpt_reference.py [--steps 10] [--batch 16] [--lr 0.1]
    .venv/bin/python bench/gpt_reference.py --validation [--steps 300] [--sequences 128]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from wse.host.compiler.transformer_capture import capture
from wse.host.data import load_text_corpus
from wse.host.memoryx import MemoryX, OptimizerConfig
from wse.host.runtime.loss import cross_entropy
from wse.host.runtime.transformer_reference import TransformerReference

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "char_gpt.py"


def _example():
    spec = importlib.util.spec_from_file_location("char_gpt", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


def validation_budget(steps: int, batch: int = 16, lr: float = 3e-3, sequences: int = 128, report: int = 0,
                      seed: int = 0, emit=None) -> dict:
    """Train ``examples/char_gpt.py`` for ``steps`` Adam steps of ``batch`` sequences on both sides
    (functional model with MemoryX's Adam; PyTorch fp32 with ``torch.optim.Adam``; same initial
    weights, same batches) and return the final validation losses on ``sequences`` fixed
    validation sequences and their relative difference. ``emit(line)`` gets every evaluation
    (every ``report`` steps, and the last)."""
    example = _example()
    corpus = load_text_corpus()
    x, y = corpus.sequences("train", example.CONTEXT)
    vx, vy = corpus.sequences("validation", example.CONTEXT)
    pick = np.random.default_rng(1).permutation(len(vx))[:sequences]
    vx, vy = vx[pick], vy[pick]
    order = np.random.default_rng(seed).permutation(len(x))
    torch.manual_seed(seed)
    model = example.model(corpus.vocab_size)
    reference = TransformerReference(capture(model, torch.from_numpy(x[:batch])))
    memoryx = MemoryX.from_state_dict(model.state_dict(), OptimizerConfig("adam", lr=lr))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    def evaluate(step: int) -> dict:
        params = {name: memoryx.weight(name) for name in memoryx.names()}
        ours, theirs = [], []
        with torch.no_grad():
            for start in range(0, len(vx), batch):
                xb, yb = vx[start:start + batch], vy[start:start + batch]
                logits = reference.logits(params, xb)
                ours.append(cross_entropy(logits.reshape(-1, logits.shape[-1]), yb.reshape(-1)))
                t = model(torch.from_numpy(xb))
                theirs.append(F.cross_entropy(t.reshape(-1, t.shape[-1]), torch.from_numpy(yb).reshape(-1),
                                              reduction="none").numpy())
        ours_v, theirs_v = float(np.mean(np.concatenate(ours))), float(np.mean(np.concatenate(theirs)))
        line = {"step": step, "validation_loss": ours_v, "torch_validation_loss": theirs_v,
                "rel_diff": abs(ours_v - theirs_v) / theirs_v}
        if emit is not None:
            emit(line)
        return line

    for step in range(steps):
        at = (step * batch) % (len(order) - batch + 1)
        xb, yb = x[order[at:at + batch]], y[order[at:at + batch]]
        params = {name: memoryx.weight(name) for name in memoryx.names()}
        memoryx.apply_gradients(reference.step(params, xb, yb).grads)
        optimizer.zero_grad()
        logits = model(torch.from_numpy(xb))
        F.cross_entropy(logits.reshape(-1, corpus.vocab_size), torch.from_numpy(yb).reshape(-1)).backward()
        optimizer.step()
        if report and (step + 1) % report == 0 and step + 1 < steps:
            evaluate(step + 1)
    final = evaluate(steps)
    return {**final, "unigram_entropy_nats": corpus.unigram_entropy()}


def main() -> None:
    """Run the comparison and print JSON lines."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="steps (default 10; 300 with --validation)")
    parser.add_argument("--batch", type=int, default=16, help="sequences per step (default 16)")
    parser.add_argument("--lr", type=float, default=None, help="learning rate (default 0.1 SGD; 3e-3 Adam with "
                                                               "--validation)")
    parser.add_argument("--validation", action="store_true",
                        help="validation loss after a fixed budget of Adam steps, both sides")
    parser.add_argument("--sequences", type=int, default=128, help="validation sequences (default 128)")
    parser.add_argument("--report", type=int, default=50, help="with --validation: steps between evaluations")
    args = parser.parse_args()
    bad = [f"--{name} {value}" for name, value in (("steps", args.steps), ("lr", args.lr), ("batch", args.batch),
                                                   ("sequences", args.sequences), ("report", args.report))
           if value is not None and not value > 0]
    if bad:
        print(f"gpt_reference: --steps, --lr, --batch, --sequences and --report must be positive, not "
              f"{', '.join(bad)}", file=sys.stderr)
        sys.exit(2)
    torch.set_num_threads(1)
    if args.validation:
        steps = 300 if args.steps is None else args.steps
        lr = 3e-3 if args.lr is None else args.lr
        start = time.process_time()
        result = validation_budget(steps, args.batch, lr, args.sequences, args.report,
                                   emit=lambda line: print(json.dumps(line), flush=True))
        print(json.dumps({"summary": True, "steps": steps, "batch": args.batch, "lr": lr, "optimizer": "adam",
                          "validation_sequences": args.sequences, "validation_loss": result["validation_loss"],
                          "torch_validation_loss": result["torch_validation_loss"], "rel_diff": result["rel_diff"],
                          "target_rel": 0.01, "unigram_entropy_nats": round(result["unigram_entropy_nats"], 4),
                          "cpu_s": round(time.process_time() - start, 1)}), flush=True)
        return
    args.steps = 10 if args.steps is None else args.steps
    args.lr = 0.1 if args.lr is None else args.lr
    example = _example()
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
