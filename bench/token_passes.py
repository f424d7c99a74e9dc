"""Token passes of the streamed GEMM: what a realistic batch costs on a 16x16 mesh.

A link of the partial-sum ring carries one message of at most 8 tokens per PE
(default queues), so a column's larger token block runs in passes, the
weights streaming once per pass (``docs/weight_streaming.md`` section 5.1).
For each model it compiles a training step at the base batch (8 tokens per
PE: one pass) and at the large batch (32 per PE: four passes), and prints one
JSON line per run and phase group from the static cycle model (equal to the
golden model's counts: ``tests/test_token_passes.py``):

* ``cycles`` and ``cycles_per_token`` per group (forward, backward-data,
  backward-weight, loss) and for the whole step, ``passes``;
* ``per_token_vs_base``: cycles per token over the base batch's (below 1:
  the larger batch is cheaper per token);
* ``one_pass``: the same large batch with queues deep enough for one pass
  (``rx_depth`` raised: a hypothetical fabric), so ``passes_cost`` is what
  the passes themselves cost (gathers, refilling the ring per pass).

Models: FC-MNIST (784-256-256-10) and ``Linear(64, 256), ReLU, Linear(256, 64)``
(the width of the GPT example's MLP). The runs use the default
``FabricConfig`` (8,192 words per PE); the ``step`` line's ``words_per_pe`` and
``sram_words`` give the memory the large batch uses (op lists included)
against what a PE has. Only the hypothetical one-pass fabric gets
``sram_words=16384`` (its buffers hold all 32 tokens at once); no cycle
depends on the memory size.

    .venv/bin/python bench/token_passes.py [--mesh 16x16] [--base 8] [--large 32]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn

from wse.config import FabricConfig, parse_mesh
from wse.host.compiler import compile_model
from wse.host.compiler.weight_streaming import pass_limit

GROUPS = ("forward", "backward-data", "backward-weight", "loss")
MODELS = {
    "fc_mnist": lambda: nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                                      nn.Linear(256, 10)),
    "mlp_64_256_64": lambda: nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64)),
}


def step(model: nn.Module, batch: int, config: FabricConfig) -> tuple[dict, float]:
    """Cycles of one training step by phase group and in total (and ``words``, the words per PE
    its memory map uses), and the compile's CPU seconds."""
    features = model[0].in_features
    start = time.process_time()
    exe = compile_model(model, torch.zeros(batch, features), batch=batch, config=config)
    seconds = time.process_time() - start
    names = exe.sequences["train"]
    out = {g: sum(exe.phases[n].cycles for n in names if exe.phases[n].group == g) for g in GROUPS}
    out["step"] = sum(exe.phases[n].cycles for n in names)
    out["words"] = max(addr + words for addr, words in exe.regions.values())
    return out, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mesh", default="16x16", help="mesh WxH (default 16x16)")
    parser.add_argument("--base", type=int, default=8, help="tokens per PE of the one-pass baseline (default 8)")
    parser.add_argument("--large", type=int, default=32, help="tokens per PE of the large batch (default 32)")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    args = parser.parse_args()
    width, height = parse_mesh(args.mesh)
    for name in args.models.split(","):
        make = MODELS[name]
        config = FabricConfig(width=width, height=height)
        deep = config.replace(rx_depth=config.rx_depth + args.large, sram_words=16384)   # one pass of every token
        base, _ = step(make(), args.base * width, config)
        large, seconds = step(make(), args.large * width, config)
        one, _ = step(make(), args.large * width, deep)
        passes = -(-args.large // pass_limit(config))
        for group in (*GROUPS, "step"):
            line = {"model": name, "mesh": args.mesh, "group": group,
                    "base_tokens_per_pe": args.base, "base_batch": args.base * width, "base_cycles": base[group],
                    "tokens_per_pe": args.large, "batch": args.large * width, "passes": passes,
                    "cycles": large[group], "cycles_per_token": round(large[group] / (args.large * width), 2),
                    "base_cycles_per_token": round(base[group] / (args.base * width), 2),
                    "per_token_vs_base": round(large[group] * args.base / (base[group] * args.large), 4),
                    "one_pass_cycles": one[group],
                    "passes_cost": round(large[group] / one[group], 4) if one[group] else None}
            if group == "step":
                line.update(words_per_pe=large["words"], base_words_per_pe=base["words"],
                            sram_words=config.sram_words, compile_cpu_s=round(seconds, 1))
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
