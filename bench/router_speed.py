"""Router-step speed of the vectorized model: the numba kernels against the torch form, same mesh and cycles.

Every router of a ``width x height`` mesh with 8 colors (``--colors``) in a
busy steady state: color ``c`` flows in one of the four directions (``c mod
4``: west to east, east to west, north to south, south to north), every FIFO
starts half full, so every router has wavelets to move and two colors
contend for each output port (the rotating grant with atomic multicast
decides). The same cycles run on the numba kernels
(``VectorRouters.decide``/``finish``, ``sim/vector/kernels.py``) and on
``TorchRouters.step`` (``sim/vector/torch_routers.py``) on the CPU and, where
torch finds one, on CUDA; the final states are compared. Prints one JSON line
per mesh and side: PE-cycles/s (routers times cycles over the wall time of
the cycles, set-up excluded), the ratio to the numba side, and whether the
state equals the numba side's bit for bit.

Usage: python bench/router_speed.py [--meshes 64x64 256x256 750x994] [--cycles 20] [--colors 8]
       [--torch-threads 1]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from types import SimpleNamespace

import numpy as np
import torch

from wse.config import FabricConfig, Port, UsageError, parse_mesh
from wse.sim.vector.routers import VectorRouters
from wse.sim.vector.torch_routers import TorchRouters

#: (input port, output port) of color ``c`` by ``c mod 4``.
FLOWS = [(Port.W, Port.E), (Port.E, Port.W), (Port.N, Port.S), (Port.S, Port.N)]


def busy_mesh(width: int, height: int, colors: int) -> VectorRouters:
    """The benchmark's routers (see the module text), with PE queues that hold nothing."""
    cfg = FabricConfig(width=width, height=height, colors=colors)
    n = width * height
    queues = SimpleNamespace(   # the PE-queue arrays the router step touches (PeState's layout, no memories)
        rx_depth=cfg.rx_depth, rdata=np.zeros((n, colors, cfg.rx_depth + 1), dtype=np.uint32),
        rctrl=np.zeros((n, colors, cfg.rx_depth + 1), dtype=np.uint8), rhead=np.zeros((n, colors), dtype=np.int64),
        rcount=np.zeros((n, colors), dtype=np.int64), tdata=np.zeros((n, cfg.tx_depth + 2), dtype=np.uint32),
        tcolor=np.zeros((n, cfg.tx_depth + 2), dtype=np.int64), tctrl=np.zeros((n, cfg.tx_depth + 2), dtype=np.uint8),
        thead=np.zeros(n, dtype=np.int64), tcount=np.zeros(n, dtype=np.int64))
    routers = VectorRouters(cfg, queues)
    for c in range(colors):
        source, target = FLOWS[c % 4]
        routers.route_in[:, c] = int(source)
        routers.route_mask[:, c] = 1 << int(target)
    routers.count[:] = cfg.router_depth // 2 or 1
    routers.data[:] = np.arange(routers.data.size, dtype=np.uint32).reshape(routers.data.shape)
    routers.begin_run()
    return routers


def _numba(routers: VectorRouters, cycles: int) -> float:
    routers.decide(0)                                  # compiled loops loaded (cached on disk)
    routers.finish()
    start = time.perf_counter()
    for t in range(1, cycles + 1):
        routers.decide(t % routers.colors)
        routers.finish()
    return time.perf_counter() - start


def _torch(routers: VectorRouters, device: str, cycles: int) -> tuple[float, TorchRouters]:
    ours = TorchRouters(routers, device)
    ours.step(0)
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for t in range(1, cycles + 1):
        ours.step(t % routers.colors)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, ours


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--meshes", nargs="+", default=["64x64", "256x256", "750x994"])
    parser.add_argument("--cycles", type=int, default=20, help="timed cycles per side (after one warm-up cycle)")
    parser.add_argument("--colors", type=int, default=8)
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="torch CPU threads (default 1, as the numba side; 0: torch's default)")
    args = parser.parse_args(argv)
    try:
        meshes = [parse_mesh(text) for text in args.meshes]
        if args.cycles < 1 or not 1 <= args.colors <= 32:
            raise UsageError(f"--cycles must be positive and --colors 1 to 32, not {args.cycles} and {args.colors}")
    except UsageError as exc:
        print(f"router_speed: {exc}", file=sys.stderr)
        return 2
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for (width, height), text in zip(meshes, args.meshes):
        n = width * height
        reference = busy_mesh(width, height, args.colors)
        numba_s = _numba(reference, args.cycles)
        common = {"bench": "router_speed", "mesh": text, "colors": args.colors, "cycles": args.cycles}
        rate = n * args.cycles / numba_s
        print(json.dumps({**common, "side": "numba", "pe_cycles_per_s": float(f"{rate:.3g}"),
                          "hops": int(reference.hops), "what": "VectorRouters.decide + finish"}), flush=True)
        for device in devices:
            seconds, ours = _torch(busy_mesh(width, height, args.colors), device, args.cycles)
            state = ours.state()
            same = all(np.array_equal(state[name], getattr(reference, name))
                       for name in ("data", "ctrl", "head", "count")) and state["hops"] == reference.hops
            print(json.dumps({**common, "side": f"torch-{device}", "pe_cycles_per_s": float(f"{n * args.cycles / seconds:.3g}"),
                              "ratio_to_numba": round(numba_s / seconds, 3), "same_state": bool(same),
                              "torch_threads": torch.get_num_threads() if device == "cpu" else None,
                              "what": "TorchRouters.step, eager"}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
