"""``layernorm_bwd``: LayerNorm's backward pass over tokens x features
(``layernorm_bwd.s``): ``dx``, ``dgamma`` and ``dbeta``.

Layout: the forward's (:class:`~.gelu.TokenPlan`: feature ``k`` on mesh row
``k mod H``, token blocks over the columns), with the forward's ``xhat`` where
its ``y`` was and its ``r`` (one per token) on every PE of the column, as the
forward leaves them. Order of the float operations: exactly
:func:`wse.firmware.training.transformer.layernorm_backward` with
``rows = H`` and the columns' token blocks (the reference calls it):

* the two feature sums (of ``g = mul(dy, gamma)`` and of ``mul(g, xhat)``)
  travel together, one ``2t`` vector per PE, down the column as the forward's
  chain (each PE's sum over its features in order, the rows north to south);
  the south PE finishes ``a`` and ``c`` (``mul(S, 1/D)``) and sends them back
  north;
* ``dgamma`` and ``dbeta`` are the weight gradients' ``token_sum``: each PE
  sums its tokens per feature in order (``fsum`` from ``+0``), then a chain
  east along the mesh row adds the columns' sums in column order; the last
  column with tokens holds them.
"""

from __future__ import annotations

import numpy as np

from wse import numerics as fp
from wse.config import FabricConfig, Port
from wse.firmware.deadlock import load_checked
from wse.firmware.training.transformer import layernorm, layernorm_backward

from .common import (Kernel, chain_color_grids, chain_routes, kernel_program, mesh_coordinates, read_per_pe,
                     row_cells, write_params, write_per_pe)
from .gelu import TokenPlan, plan_tokens
from .layernorm import BACK_COLORS, CHAIN_COLORS, EPS, column_rings, column_routes

__all__ = ["LayerNormBackward", "ROW_COLORS", "BUFFERS", "row_routes", "addresses", "feature_token_sizes",
           "used_columns"]

T_START = 0
#: The chain east along each mesh row (dgamma, dbeta).
ROW_COLORS = (4, 5)
#: Buffers: ``f*t`` words, ``2t``, ``t``, ``f``, ``2f`` words each (``layernorm_bwd.s``).
BUFFERS = (("DY", "XH", "G", "GX", "DX"), ("P", "S"), ("RR",), ("GAM",), ("GD", "RUN"))


def used_columns(plan: TokenPlan) -> int:
    """Mesh columns that hold tokens (the empty blocks come last)."""
    return sum(1 for b in plan.token_blocks if len(b))


def row_routes(plan: TokenPlan) -> list:
    """Per mesh row: the chain east over the columns that hold tokens."""
    cols = used_columns(plan)
    return [route for y in range(plan.config.height)
            for route in chain_routes(row_cells(y, plan.config.width)[:cols], Port.E, ROW_COLORS,
                                      from_edge=False, to_edge=False)]


def feature_token_sizes(plan: TokenPlan) -> tuple[np.ndarray, np.ndarray]:
    """``(f, t)``: ``[height, width]`` features and tokens held by every PE."""
    shape = plan.counts.shape
    feats = np.broadcast_to(np.array([len(plan.row_features(y)) for y in range(plan.config.height)])[:, None], shape)
    tokens = np.broadcast_to(np.array([len(b) for b in plan.token_blocks])[None, :], shape)
    return feats, tokens


def addresses(plan: TokenPlan) -> dict[str, np.ndarray]:
    """``[height, width]`` address of every buffer in every PE."""
    feats, tokens = feature_token_sizes(plan)
    at, out = np.full(plan.counts.shape, plan.heap, dtype=np.int64), {}
    for names, size in zip(BUFFERS, (plan.counts, 2 * tokens, tokens, feats, 2 * feats)):
        for name in names:
            out[name] = at.copy()
            at = at + size
    return out


def _params(plan: TokenPlan) -> dict[str, np.ndarray]:
    cfg = plan.config
    column, row = mesh_coordinates(cfg)
    c_in, c_out = chain_color_grids(row, CHAIN_COLORS)
    b_in, b_out = chain_color_grids(cfg.height - 1 - row, BACK_COLORS)
    r_in, r_out = chain_color_grids(column, ROW_COLORS)
    feats, tokens = feature_token_sizes(plan)
    params = {"p_f": feats, "p_t": tokens, "p_invd": np.full(feats.shape, fp.f2b(1.0 / plan.features)),
              "p_first": row == 0, "p_last": row == cfg.height - 1, "p_cin": c_in, "p_cout": c_out,
              "p_bin": b_in, "p_bout": b_out, "p_west": column == 0, "p_east": column == used_columns(plan) - 1,
              "p_rin": r_in, "p_rout": r_out}
    params.update({f"p_{name.lower()}": addr for name, addr in addresses(plan).items()})
    return params


def _saved(plan: TokenPlan, inputs) -> dict[str, np.ndarray]:
    return {"xhat": fp.as_bits(inputs["xhat"]), "r": fp.as_bits(inputs["r"])}


class LayerNormBackward(Kernel):
    name = "layernorm_bwd"
    summary = ("LayerNorm backward of tokens x features (the forward's layout): dx with both feature sums "
               "chained down the columns at once, dgamma and dbeta chained along the rows")
    defaults = {"rows": 16, "cols": 32}
    colors = 6
    tasks = 1

    def describe(self, sizes: dict) -> str:
        return f"{sizes['rows']} tokens x {sizes['cols']} features"

    def plan(self, config: FabricConfig, sizes: dict) -> TokenPlan:
        program = kernel_program("layernorm_bwd", config, T_START=T_START)
        tokens, features = sizes["rows"], sizes["cols"]
        plan = plan_tokens(self, config, tokens, features, program, 5, "backward")
        feats, tok = feature_token_sizes(plan)
        per_pe = 5 * plan.counts + 5 * tok + 5 * feats
        self.check_memory(f"{self.name} of {tokens} tokens x {features} features", config, program,
                          int(per_pe.max()))
        return plan

    def inputs(self, plan: TokenPlan, rng: np.random.Generator) -> dict[str, np.ndarray]:
        shape = (plan.tokens, plan.features)
        x = fp.as_bits((2.0 * rng.standard_normal(shape) + 0.5).astype(np.float32))
        gamma = (1.0 + 0.2 * rng.standard_normal(plan.features)).astype(np.float32)
        beta = np.zeros(plan.features, dtype=np.float32)
        _, saved = layernorm(x, fp.as_bits(gamma), fp.as_bits(beta), EPS, rows=plan.config.height)
        return {"dy": rng.standard_normal(shape, dtype=np.float32), "gamma": gamma,
                "xhat": fp.as_float(saved["xhat"]).copy(), "r": fp.as_float(saved["r"]).copy()}

    def reference(self, plan: TokenPlan, inputs) -> tuple[np.ndarray, np.ndarray]:
        blocks = [len(b) for b in plan.token_blocks if len(b)]
        dx, dgamma, dbeta = layernorm_backward(fp.as_bits(inputs["dy"]), fp.as_bits(inputs["gamma"]),
                                               _saved(plan, inputs), rows=plan.config.height, blocks=blocks)
        dy, xhat, gamma = (inputs[k].astype(np.float64) for k in ("dy", "xhat", "gamma"))
        r = inputs["r"].astype(np.float64)[:, None]
        g = dy * gamma
        dx64 = (g - g.mean(axis=1, keepdims=True) - xhat * (g * xhat).mean(axis=1, keepdims=True)) * r
        exact = np.concatenate([dx64.reshape(-1), (dy * xhat).sum(axis=0), dy.sum(axis=0)])
        return np.concatenate([dx.reshape(-1), dgamma, dbeta]), exact

    def execute(self, device, plan: TokenPlan, inputs) -> tuple[np.ndarray, int]:
        program, cfg = plan.program, plan.config
        device.load(program)
        load_checked(device, cfg, column_routes(cfg) + row_routes(plan), f"kernel {self.name}",
                     rings=column_rings(cfg))
        write_params(device, program, _params(plan))
        addr = addresses(plan)
        write_per_pe(device, addr["DY"], plan.pe_words(fp.as_bits(inputs["dy"])))
        write_per_pe(device, addr["XH"], plan.pe_words(fp.as_bits(inputs["xhat"])))
        gamma, r = fp.as_bits(inputs["gamma"]), fp.as_bits(inputs["r"])
        write_per_pe(device, addr["GAM"], {(x, y): gamma[plan.row_features(y)]
                                           for y in range(cfg.height) for x in range(cfg.width)})
        write_per_pe(device, addr["RR"], {(x, y): r[b.start:b.stop]
                                          for y in range(cfg.height) for x, b in enumerate(plan.token_blocks)})
        device.launch(T_START)
        cycles = device.run()
        dx = plan.gather(read_per_pe(device, addr["DX"], plan.counts))
        grads = np.zeros((2, plan.features), dtype=np.uint32)
        east = used_columns(plan) - 1
        for y in range(cfg.height):
            feats = plan.row_features(y)
            if len(feats):
                words = device.memcpy_d2h(int(addr["RUN"][y, east]), 2 * len(feats), (east, y, 1, 1))[0, 0]
                grads[:, feats] = words.reshape(2, len(feats))
        return np.concatenate([dx.reshape(-1), grads[0], grads[1]]), cycles
