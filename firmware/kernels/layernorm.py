"""``layernorm``: LayerNorm forward over the features of every token, the mean
and the variance reduced down the mesh columns (``layernorm.s``).

Layout: :class:`~.gelu.TokenPlan`'s (feature ``k`` on mesh row ``k mod H``,
token blocks over the columns), each PE also holding the ``gamma`` and
``beta`` of its features. Order of the float operations: exactly
:func:`wse.firmware.training.transformer.layernorm` with ``rows = H`` (the
reference calls it): each PE sums its features in order, the column chains
the rows' sums north to south, the south PE finishes the mean (and later
``r = rsqrt(add(var, eps))``, with :func:`~wse.firmware.training.transcendental.rsqrt`'s
steps) once per token and sends it back north.
"""

from __future__ import annotations

import numpy as np

from wse import numerics as fp
from wse.config import FabricConfig, Port
from wse.firmware.deadlock import Ring, load_checked
from wse.firmware.training import transcendental as tr
from wse.firmware.training.transformer import layernorm

from .common import (Kernel, chain_color_grids, chain_in_color, chain_out_color, chain_routes, column_cells,
                     kernel_program, mesh_coordinates, read_per_pe, write_params, write_per_pe)
from .gelu import TokenPlan, plan_tokens

__all__ = ["LayerNorm", "EPS", "CHAIN_COLORS", "BACK_COLORS", "BUFFERS", "column_routes", "column_rings", "addresses",
           "params"]

T_START = 0
#: ``nn.LayerNorm``'s default epsilon.
EPS = 1e-5
#: The chain south down each column and the chain back north (two colors each, alternating).
CHAIN_COLORS = (0, 1)
BACK_COLORS = (2, 3)
#: Buffers after ``p_heap``: ``f*t`` words, ``t`` words, ``f`` words each (``layernorm.s``).
BUFFERS = (("X", "XC", "SQ", "Y"), ("P", "S", "HH", "YR", "Q"), ("G", "B"))


def column_routes(config: FabricConfig) -> list:
    """Per mesh column: the chain south and the chain back north from the south PE."""
    routes = []
    for x in range(config.width):
        cells = column_cells(x, config.height)
        routes += chain_routes(cells, Port.S, CHAIN_COLORS, from_edge=False, to_edge=False)
        routes += chain_routes(cells[::-1], Port.N, BACK_COLORS, from_edge=False, to_edge=False)
    return routes


def column_rings(config: FabricConfig) -> list[Ring]:
    """The two-PE cycles of the chains south and back north, proved live by the
    rotation rule: row ``y+1`` takes its whole sum from row ``y`` before it
    sends anything back north."""
    height, rings = config.height, []
    for x in range(config.width):
        for y in range(height - 1):
            back = height - 1 - y
            members = ((x, y, chain_in_color(back, BACK_COLORS), chain_out_color(y, CHAIN_COLORS)),
                       (x, y + 1, chain_in_color(y + 1, CHAIN_COLORS), chain_out_color(back - 1, BACK_COLORS)))
            rings.append(Ring(f"layernorm column {x} rows {y}, {y + 1}", members, receive_first=(False, True)))
    return rings


def params(plan: TokenPlan) -> dict[str, np.ndarray]:
    cfg = plan.config
    _, row = mesh_coordinates(cfg)
    c_in, c_out = chain_color_grids(row, CHAIN_COLORS)
    b_in, b_out = chain_color_grids(cfg.height - 1 - row, BACK_COLORS)
    feats = np.array([len(plan.row_features(y)) for y in range(cfg.height)])
    tokens = np.array([len(b) for b in plan.token_blocks])
    shape = row.shape
    return {"p_f": np.broadcast_to(feats[:, None], shape), "p_t": np.broadcast_to(tokens[None, :], shape),
            "p_heap": np.full(shape, plan.heap), "p_invd": np.full(shape, fp.f2b(1.0 / plan.features)),
            "p_first": row == 0, "p_last": row == cfg.height - 1, "p_cin": c_in, "p_cout": c_out,
            "p_bin": b_in, "p_bout": b_out}


def addresses(plan: TokenPlan) -> dict[str, np.ndarray]:
    """``[height, width]`` address of every buffer in every PE (after a run ``Y`` holds ``y``,
    ``XC`` the backward pass's ``xhat`` and ``S`` each token's ``r``)."""
    cfg = plan.config
    shape = plan.counts.shape
    feats = np.broadcast_to(np.array([len(plan.row_features(y)) for y in range(cfg.height)])[:, None], shape)
    tokens = np.broadcast_to(np.array([len(b) for b in plan.token_blocks])[None, :], shape)
    at, out = np.full(plan.counts.shape, plan.heap, dtype=np.int64), {}
    for names, size in zip(BUFFERS, (plan.counts, tokens, feats)):
        for name in names:
            out[name] = at.copy()
            at = at + size
    return out


class LayerNorm(Kernel):
    name = "layernorm"
    summary = ("LayerNorm forward of tokens x features (features on rows, tokens over columns): mean and "
               "variance chained down the columns, one rsqrt per token")
    defaults = {"rows": 16, "cols": 32}
    colors = 4
    tasks = 1

    def describe(self, sizes: dict) -> str:
        return f"{sizes['rows']} tokens x {sizes['cols']} features"

    def plan(self, config: FabricConfig, sizes: dict, eps: float = EPS) -> TokenPlan:
        """The layout and program for ``sizes``; ``eps`` is the LayerNorm's epsilon (binary32)."""
        program = kernel_program("layernorm", config, T_START=T_START, LN_EPS=fp.f2b(eps),
                                 RSQRT_MAGIC=tr.RSQRT_MAGIC)
        tokens, features = sizes["rows"], sizes["cols"]
        plan = plan_tokens(self, config, tokens, features, program, 4, "forward")
        per_pe = 4 * plan.counts + 5 * len(plan.token_blocks[0]) + 2 * len(plan.row_features(0))
        self.check_memory(f"{self.name} of {tokens} tokens x {features} features", config, program,
                          int(per_pe.max()))
        return plan

    def inputs(self, plan: TokenPlan, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {"x": (2.0 * rng.standard_normal((plan.tokens, plan.features)) + 0.5).astype(np.float32),
                "gamma": (1.0 + 0.2 * rng.standard_normal(plan.features)).astype(np.float32),
                "beta": (0.1 * rng.standard_normal(plan.features)).astype(np.float32)}

    def reference(self, plan: TokenPlan, inputs) -> tuple[np.ndarray, np.ndarray]:
        x, gamma, beta = (fp.as_bits(inputs[k]) for k in ("x", "gamma", "beta"))
        bits, _ = layernorm(x, gamma, beta, EPS, rows=plan.config.height)
        x64 = inputs["x"].astype(np.float64)
        xc = x64 - x64.mean(axis=1, keepdims=True)
        exact = xc / np.sqrt((xc * xc).mean(axis=1, keepdims=True) + EPS) * inputs["gamma"] + inputs["beta"]
        return bits, exact

    def execute(self, device, plan: TokenPlan, inputs) -> tuple[np.ndarray, int]:
        program, cfg = plan.program, plan.config
        device.load(program)
        load_checked(device, cfg, column_routes(cfg), f"kernel {self.name}", rings=column_rings(cfg))
        write_params(device, program, params(plan))
        addr = addresses(plan)
        write_per_pe(device, addr["X"], plan.pe_words(fp.as_bits(inputs["x"])))
        for name, key in (("G", "gamma"), ("B", "beta")):
            values = fp.as_bits(inputs[key])
            write_per_pe(device, addr[name], {(x, y): values[plan.row_features(y)]
                                              for y in range(cfg.height) for x in range(cfg.width)})
        device.launch(T_START)
        cycles = device.run()
        return plan.gather(read_per_pe(device, addr["Y"], plan.counts)), cycles
