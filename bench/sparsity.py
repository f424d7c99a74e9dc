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
  power-law mask (features dealt by load, most non-zeros first) and for a
  plain block deal of the same mask (target: at most 1.05);
* ``breakdown`` (``--breakdown S``, alone): the large layer's three phases,
  dense and at sparsity ``S``: cycles, each PE's stall-free cycles (mean,
  max) and the share spent waiting on other PEs;
* ``training step`` (``--step``, default on): one training step of sparse
  weight streaming as ``wse train --sparsity`` compiles it (``train.s``'s
  ``spgemm`` and ``spwgrad`` records), cycles per group of phases (forward,
  backward-data, backward-weight, loss) and in total, with the ratio to the
  dense step: FC-MNIST (784-256-256-10, batch 64, the hidden layers masked
  by magnitude, the classifier dense) and the large layer (``Linear(IN,
  OUT)`` between two small ones, its three phases), at each sparsity (0: the
  sparse path with every weight kept); ``total`` runs every masked phase
  sparse, ``chosen_total`` is what ``wse train`` runs (each phase sparse or
  dense, whichever the cycle model counts fewer for: ``dense_phases``), and
  the picture plots the latter.

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
GROUPS = ("forward", "backward-data", "backward-weight", "loss")


def step_cycles(exe, phases=None) -> dict:
    """Cycles of a training step's phases (``phases``: only these) by group, ``backward`` and ``total``."""
    names = [n for n in exe.sequences["train"] if phases is None or n in phases]
    out = {g: sum(exe.phases[n].cycles for n in names if exe.phases[n].group == g) for g in GROUPS}
    out["backward"] = out["backward-data"] + out["backward-weight"]
    out["total"] = sum(exe.phases[n].cycles for n in names)
    out["phases"] = {n: exe.phases[n].cycles for n in names}
    return out


def training_rows(name: str, model, example, cfg: FabricConfig, batch: int, masked: list, sparsities,
                  phases=None):
    """JSON rows of a training step's cycles, dense and at each sparsity (masks by magnitude on ``masked``)."""
    from wse.host.compiler.sparse import compile_sparse, layer_masks

    weights = {k: v.detach().numpy() for k, v in model.state_dict().items() if k in masked}
    start = time.perf_counter()
    dense = step_cycles(compile_sparse(model, example, config=cfg, batch=batch, masks={}, progress=False), phases)
    base = {"bench": "sparsity", "kind": "training step", "model": name, "mesh": cfg.mesh, "batch": batch}
    _emit({**base, "sparsity": "dense", **{k: v for k, v in dense.items() if k != "phases"},
           "seconds": round(time.perf_counter() - start, 1)})
    rows = []
    for s in sparsities:
        start = time.perf_counter()
        masks = layer_masks(weights, s, "magnitude") if s else {k: np.ones(v.shape, bool) for k, v in weights.items()}
        exe = compile_sparse(model, example, config=cfg, batch=batch, masks=masks, progress=False, choose=False)
        got = step_cycles(exe, phases)
        per_phase = got.pop("phases")
        # what wse train runs (compile_sparse's choice): each phase sparse or dense, whichever counts fewer
        chosen = sum(min(c, dense["phases"][n]) for n, c in per_phase.items())
        _emit({**base, "sparsity": s, **got, "ratio_to_dense": round(got["total"] / dense["total"], 4),
               "chosen_total": chosen, "chosen_ratio": round(chosen / dense["total"], 4),
               "dense_phases": sorted(n for n, c in per_phase.items() if c > dense["phases"][n]),
               "forward_ratio": round(got["forward"] / dense["forward"], 4),
               "backward_ratio": round(got["backward"] / dense["backward"], 4),
               "seconds": round(time.perf_counter() - start, 1)})
        rows.append({"sparsity": s, "speedup": dense["total"] / chosen})
    return rows


def breakdown_rows(cfg: FabricConfig, size: int, tokens: int, sparsity: float) -> None:
    """JSON rows of where the large layer's step goes at ``sparsity`` (``--breakdown``): per phase, dense
    and sparse, the cycles, each PE's cycles without stalls (mean, max; from the timing mirror) and the
    share of the cycles spent waiting (cycles over the mean stall-free count, minus 1)."""
    import torch

    from wse.firmware.timing_ops import BUSY, RECV, VEC
    from wse.host.compiler.frontend import trace
    from wse.host.compiler.sparse import layer_masks
    from wse.host.compiler.weight_streaming import plan

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, size), torch.nn.ReLU(), torch.nn.Linear(size, size),
                                torch.nn.ReLU(), torch.nn.Linear(size, 16))
    big = cfg.replace(sram_words=max(cfg.sram_words, 32768))
    masks = layer_masks({"2.weight": model.state_dict()["2.weight"].numpy()}, sparsity, "magnitude")
    graph = trace(model, torch.zeros(tokens, 16), loss="cross_entropy")
    for label, m in (("dense", {}), (sparsity, masks)):
        p = plan(graph, big, tokens, m)
        for name in ("fwd 2", "bwd-data 2", "bwd-weight 2"):
            phase = p.phases[name]
            ops, starts, ends = cycle_model.phase_ops(p, phase)
            free = []
            for a, b in zip(starts, ends):
                o = ops[a:b]
                free.append(int(o[o[:, 0] == BUSY, 1].sum() + (o[:, 0] == RECV).sum()
                                + (o[o[:, 0] == VEC, 1] + 1).sum()))
            cycles = cycle_model.replay(cycle_model.Network(p.config, p.routes), ops, starts, ends,
                                        cycle_model.phase_injections(phase))
            _emit({"bench": "sparsity", "kind": "breakdown", "layer": f"{size}x{size}", "sparsity": label,
                   "phase": name, "cycles": cycles, "stall_free_mean": round(float(np.mean(free))),
                   "stall_free_max": max(free), "wait_share": round(cycles / np.mean(free) - 1, 4)})


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


def _picture(path: str, rows: list[dict], f: float, title: str, steps: dict | None = None) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = np.array([r["sparsity"] for r in rows])
    grid = np.linspace(0.0, 0.99, 200)
    fig, ax = plt.subplots(figsize=(6, 4.2))
    ax.plot(grid, 1 / (1 - grid), "k--", label="ideal 1/(1-s)")
    ax.plot(grid, 1 / (f + (1 - f) * (1 - grid)), "C1-", label=f"Amdahl, measured overhead f={f:.4f}")
    ax.plot(s, [r["speedup"] for r in rows], "C0o-", label="spgemm forward (cycle model = golden)")
    for i, (name, points) in enumerate((steps or {}).items()):
        points = sorted(points, key=lambda r: r["sparsity"])
        ax.plot([r["sparsity"] for r in points], [r["speedup"] for r in points], f"C{i + 2}s-",
                label=f"training step, {name}")
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
    parser.add_argument("--no-step", dest="step", action="store_false",
                        help="skip the training-step rows (FC-MNIST and the large layer)")
    parser.add_argument("--no-fc-mnist", dest="fc_mnist", action="store_false",
                        help="skip FC-MNIST's training-step rows")
    parser.add_argument("--no-kernel", dest="kernel", action="store_false",
                        help="skip the library kernel's rows (the forward GEMM alone and the imbalance)")
    parser.add_argument("--breakdown", type=float, default=None, metavar="S",
                        help="only the large layer's phases at sparsity S and dense: cycles, stall-free "
                             "cycles per PE and the share spent waiting")
    args = parser.parse_args()
    width, height = parse_mesh(args.mesh)
    cfg = FabricConfig(width=width, height=height, sram_words=16384)
    size, tokens = args.size, args.tokens_per_pe * width
    if args.breakdown is not None:
        breakdown_rows(cfg, size, tokens, args.breakdown)
        return
    layer = {"bench": "sparsity", "layer": f"{size}x{size}", "mesh": cfg.mesh, "tokens": tokens}

    sparsities = [float(v) for v in args.sparsities.split(",")]
    steps = _training(cfg, size, tokens, sparsities, args.fc_mnist) if args.step else {}
    if not args.kernel:
        return
    start = time.perf_counter()
    dense = dense_forward_cycles(cfg, size, tokens)
    _emit({**layer, "kind": "dense", "fwd_cycles": dense, "seconds": round(time.perf_counter() - start, 1)})
    empty = sparse_cycles(cfg, size, tokens, np.zeros((size, size), dtype=bool))
    f = empty / dense
    _emit({**layer, "kind": "no non-zeros", "fwd_cycles": empty, "overhead_share_f": round(f, 5)})
    rows = []
    for s in sparsities:
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
    if args.png and (rows or steps):
        _picture(args.png, rows, f, f"{size}x{size} streamed layer, {cfg.mesh}, {tokens} tokens", steps)


def _training(cfg: FabricConfig, size: int, tokens: int, sparsities, fc_mnist: bool = True) -> dict:
    """The training-step rows: FC-MNIST on ``cfg``'s mesh, then the large layer (``sram_words`` at least
    32768: the sparse op lists carry a word per output step; no cycle depends on the memory size)."""
    import sys
    from pathlib import Path

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    from fc_mnist import FCMNIST

    torch.manual_seed(0)
    mnist = FabricConfig(width=cfg.width, height=cfg.height)
    steps = {}
    if fc_mnist:
        steps["FC-MNIST"] = training_rows("fc_mnist", FCMNIST(), torch.zeros(64, 784), mnist, 64,
                                          ["fc1.weight", "fc2.weight"], sparsities)
    model = torch.nn.Sequential(torch.nn.Linear(16, size), torch.nn.ReLU(), torch.nn.Linear(size, size),
                                torch.nn.ReLU(), torch.nn.Linear(size, 16))
    big = cfg.replace(sram_words=max(cfg.sram_words, 32768))   # room for the sparse op lists' step tables
    steps[f"{size}x{size} layer"] = training_rows(f"layer {size}x{size}", model, torch.zeros(tokens, 16), big,
                                                 tokens, ["2.weight"], sparsities,
                                                 phases={"fwd 2", "bwd-data 2", "bwd-weight 2"})
    return steps


if __name__ == "__main__":
    main()
