"""Sparse weight streaming against dense: cycles of one large streamed layer.

For one ``OUT x IN`` layer on a ``WxH`` mesh with tokens filling it (8 per
PE column by default, the most the partial-sum ring carries), prints JSON
lines:

* ``dense``: the forward phase of the layer compiled by the weight-streaming
  compiler (``fwd 0`` of ``Linear(IN, OUT), ReLU, Linear(OUT, 16)``), from the
  static cycle model (equal to the golden model's count);
* per sparsity ``s`` in 0, 0.5, 0.75, 0.9, 0.95, 0.99: the ``spgemm`` kernel's
  cycles on a random mask (static cycle model, equal to golden: the kernel's
  tests check it), the ratio to dense, the speedup, the ideal ``1/(1-s)``
  and Amdahl's ``1/(f + (1-f)(1-s))`` with ``f`` the measured share of the
  dense cycles that sparsity does not remove (the run with no non-zero at
  all: carriage returns and the partial-sum ring only);
* ``imbalance``: non-zeros of the most loaded mesh row over the mean, for a
  power-law mask (features dealt sorted, serpentine round robin) and for a
  plain block deal of the same mask (target: at most 1.05).

and writes a PNG of speedup against sparsity (``--png``). The PEs get
``sram_words=16384`` so that the dense model (its activations, transposes
and loss) fits at 2048 wide; no cycle depends on the memory size.

    .venv/bin/python bench/sparsity.py [--size 2048] [--mesh 16x16] [--png sparsity.png]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from wse.config import FabricConfig, parse_mesh
from wse.firmware.kernels import get_kernel
from wse.firmware.kernels.spgemm import row_imbalance, sparse_mask
from wse.firmware.kernels.spgemm_timing import timing_ops
from wse.host.compiler import cycles as cycle_model

SPARSITIES = (0.0, 0.5, 0.75, 0.9, 0.95, 0.99)


def dense_forward_cycles(cfg: FabricConfig, size: int, tokens: int) -> int:
    """Cycles of the weight-streaming forward phase of a ``size x size`` layer."""
    import torch

    from wse.host.compiler.mapper import compile_model

    model = torch.nn.Sequential(torch.nn.Linear(size, size), torch.nn.ReLU(), torch.nn.Linear(size, 16))
    exe = compile_model(model, torch.zeros(tokens, size), config=cfg, batch=tokens, cycles=False)
    phase = exe.phases["fwd 0"]
    ops, starts, ends = cycle_model.executable_phase_ops(exe, dict(exe.static)[phase.ops_addr])
    return cycle_model.replay(cycle_model.Network(cfg, exe.routes), ops, starts, ends,
                              cycle_model.phase_injections(phase), periods=False)


def sparse_cycles(cfg: FabricConfig, size: int, tokens: int, mask: np.ndarray) -> int:
    """The static cycle model's count of ``spgemm`` with ``mask``."""
    kernel = get_kernel("spgemm")
    sparsity = 1.0 - mask.mean()
    plan = kernel.plan(cfg, kernel.resolve(cfg, {"rows": size, "cols": size, "n": tokens,
                                                 "sparsity": min(sparsity, 0.999999)}))
    routes, ops, starts, ends, inject = timing_ops(plan, mask)
    return cycle_model.replay(cycle_model.Network(cfg, routes), ops, starts, ends, inject, periods=False)


def _emit(line: dict) -> None:
    print(json.dumps(line), flush=True)


def _picture(path: str, rows: list[dict], f: float, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = np.array([r["sparsity"] for r in rows])
    grid = np.linspace(0.0, 0.99, 200)
    fig, ax = plt.subplots(figsize=(6, 4.2))
    ax.plot(grid, 1 / (1 - grid), "k--", label="ideal 1/(1-s)")
    ax.plot(grid, 1 / (f + (1 - f) * (1 - grid)), "C1-", label=f"Amdahl, measured overhead f={f:.4f}")
    ax.plot(s, [r["speedup"] for r in rows], "C0o-", label="spgemm (cycle model = golden)")
    ax.set_yscale("log")
    ax.set_xlabel("sparsity s")
    ax.set_ylabel("speedup over dense weight streaming")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=2048, help="layer width (default 2048)")
    parser.add_argument("--mesh", default="16x16", help="mesh WxH (default 16x16)")
    parser.add_argument("--tokens-per-pe", type=int, default=8, help="tokens per mesh column (default 8)")
    parser.add_argument("--sparsities", default=",".join(map(str, SPARSITIES)))
    parser.add_argument("--png", default="sparsity.png", help="where to write the picture ('' for none)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    width, height = parse_mesh(args.mesh)
    cfg = FabricConfig(width=width, height=height, sram_words=16384)
    size, tokens = args.size, args.tokens_per_pe * width
    layer = {"bench": "sparsity", "layer": f"{size}x{size}", "mesh": cfg.mesh, "tokens": tokens}

    start = time.perf_counter()
    dense = dense_forward_cycles(cfg, size, tokens)
    _emit({**layer, "kind": "dense", "fwd_cycles": dense, "seconds": round(time.perf_counter() - start, 1)})
    empty = sparse_cycles(cfg, size, tokens, np.zeros((size, size), dtype=bool))
    f = empty / dense
    _emit({**layer, "kind": "no non-zeros", "fwd_cycles": empty, "overhead_share_f": round(f, 5)})
    rows = []
    for s in (float(v) for v in args.sparsities.split(",")):
        start = time.perf_counter()
        mask = sparse_mask(size, size, s, np.random.default_rng(args.seed))
        cycles = sparse_cycles(cfg, size, tokens, mask)
        row = {**layer, "kind": "sparse", "sparsity": s, "fwd_cycles": cycles, "ratio_to_dense": round(cycles / dense, 4),
               "speedup": round(dense / cycles, 3), "ideal": round(1 / (1 - s), 3),
               "amdahl": round(1 / (f + (1 - f) * (1 - s)), 3), "seconds": round(time.perf_counter() - start, 1)}
        rows.append(row)
        _emit(row)
    power = sparse_mask(size, size, 0.9, np.random.default_rng(args.seed), "power")
    _emit({**layer, "kind": "imbalance", "mask": "power law, s=0.9", "rows": height,
           **{k: round(v, 4) for k, v in row_imbalance(power.sum(axis=0), height).items()}})
    if args.png and rows:
        _picture(args.png, rows, f, f"{size}x{size} streamed layer, {cfg.mesh}, {tokens} tokens")


if __name__ == "__main__":
    main()
