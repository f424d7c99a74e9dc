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

With ``--device-step`` it runs ONE training step of ``examples/char_gpt.py``
as the compiled fabric phases (``compile_gpt``, ``GptFabric``) on a device
(``--device``, default ``vector``) on the ``--mesh`` (default 16x16) with
``--sram-words`` words per PE (default 12288: at batch 16 the step's memory plan
needs more than the default 8192, docs/transformer.md section 11), checks the
loss, logits and every gradient against the functional model bit for bit and
every phase's device cycles against the static cycle model (``GptFabric``
stops at the first run that differs), and prints one JSON line per phase kind
and a summary with the wall time.

    .venv/bin/python bench/gpt_reference.py [--steps 10] [--batch 16] [--lr 0.1]
    .venv/bin/python bench/gpt_reference.py --validation [--steps 300] [--sequences 128]
    .venv/bin/python bench/gpt_reference.py --device-step [--device vector] [--mesh 16x16] [--sram-words 12288]
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

from wse.config import UsageError
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


def device_step(device: str, mesh: str, sram_words: int, batch: int) -> None:
    """One char_gpt training step as fabric phases on ``device``: bits against the functional model, every
    phase's device cycles against the static model; JSON lines per phase kind and a summary."""
    from wse.config import FabricConfig, parse_mesh
    from wse.host.compiler.gpt_phases import KINDS, compile_gpt
    from wse.host.runtime.gpt_fabric import GptFabric

    example = _example()
    corpus = load_text_corpus()
    x, y = corpus.sequences("train", example.CONTEXT)
    index = np.random.default_rng(0).permutation(len(x))[:batch]
    torch.manual_seed(0)
    model = example.model(corpus.vocab_size)
    graph = capture(model, torch.from_numpy(x[index]))
    params = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    width, height = parse_mesh(mesh)
    config = FabricConfig(width=width, height=height, sram_words=sram_words)
    start = time.perf_counter()
    schedule = compile_gpt(graph, config, batch)
    compiled = time.perf_counter() - start
    start = time.perf_counter()
    got = GptFabric(schedule, device).step(params, x[index], y[index])
    wall = time.perf_counter() - start
    want = TransformerReference(graph, rows=height, blocks=schedule.blocks).step(params, x[index], y[index])
    same = got.loss == want.loss and np.array_equal(got.logits.view(np.uint32), want.logits.view(np.uint32)) \
        and all(np.array_equal(got.grads[k].view(np.uint32), g.view(np.uint32)) for k, g in want.grads.items())
    for kind in KINDS:
        phases = [p for p in schedule.phases if p.kind == kind]
        device_cycles = sum(sum(got.cycles[p.name]) for p in phases)
        static = sum(p.cycles * p.runs for p in phases)
        print(json.dumps({"kind": kind, "phases": len(phases), "device_cycles": device_cycles,
                          "static_cycles": static, "equal": device_cycles == static}), flush=True)
    device_total = sum(sum(c) for c in got.cycles.values())
    print(json.dumps({"summary": True, "device": device, "mesh": mesh, "sram_words": sram_words, "batch": batch,
                      "phases": len(schedule.phases), "device_cycles": device_total,
                      "static_cycles": schedule.cycles(), "every_phase_equal": all(
                          got.cycles[p.name] == ([p.cycles] * p.runs if p.kind != "host" else [])
                          for p in schedule.phases),
                      "bits_equal_functional_model": bool(same), "memory_words_per_pe": schedule.memory.words,
                      "compile_s": round(compiled, 1), "wall_s": round(wall, 1)}), flush=True)


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
    parser.add_argument("--device-step", action="store_true",
                        help="one training step as fabric phases on --device, checked against the functional "
                             "model and the static cycle model")
    parser.add_argument("--device", default="vector", help="with --device-step: the device (default vector)")
    parser.add_argument("--mesh", default="16x16", help="with --device-step: the mesh (default 16x16)")
    parser.add_argument("--sram-words", type=int, default=12288,
                        help="with --device-step: words per PE (default 12288)")
    args = parser.parse_args()
    bad = [f"--{name} {value}" for name, value in (("steps", args.steps), ("lr", args.lr), ("batch", args.batch),
                                                   ("sequences", args.sequences), ("report", args.report))
           if value is not None and not value > 0]
    if bad:
        print(f"gpt_reference: --steps, --lr, --batch, --sequences and --report must be positive, not "
              f"{', '.join(bad)}", file=sys.stderr)
        sys.exit(2)
    torch.set_num_threads(1)
    if args.device_step:
        try:
            device_step(args.device, args.mesh, args.sram_words, args.batch)
        except UsageError as error:
            print(f"gpt_reference: {error}", file=sys.stderr)
            sys.exit(2)
        return
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
