"""``axpy``: y = a x + y with y spread over the mesh and x streamed through
it (``axpy.s``, layout in :mod:`.slices`).

Order of the float operations: ``y[k] = add(y[k], mul(x[k], a))`` for every
k (one FMAC per element, two roundings). The result is read back from every
PE with ``memcpy_d2h``.
"""

from __future__ import annotations

import numpy as np

from wse.config import FabricConfig
from wse import numerics as fp
from wse.firmware.deadlock import load_checked

from .common import Kernel, kernel_program, write_params, write_per_pe
from .slices import SlicePlan, plan_slices

__all__ = ["Axpy"]

X_COLORS = (0, 1)
T_START = 2


class Axpy(Kernel):
    name = "axpy"
    summary = "y = a*x + y: y spread over the mesh, x streamed in at the west edge of each row"
    defaults = {"n": 1024}
    colors = 2
    tasks = 3

    def describe(self, sizes: dict) -> str:
        return f"n={sizes['n']}"

    def plan(self, config: FabricConfig, sizes: dict) -> SlicePlan:
        program = kernel_program("axpy", config, T_START=T_START)
        return plan_slices(self, config, sizes["n"], program)

    def inputs(self, plan: SlicePlan, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {"a": rng.standard_normal(1, dtype=np.float32),
                "x": rng.standard_normal(plan.n, dtype=np.float32),
                "y": rng.standard_normal(plan.n, dtype=np.float32)}

    def reference(self, plan: SlicePlan, inputs) -> tuple[np.ndarray, np.ndarray]:
        a, x, y = (fp.as_bits(inputs[k]) for k in ("a", "x", "y"))
        bits = fp.vadd(y, fp.vmul(x, a[0]))
        exact = inputs["y"].astype(np.float64) + np.float64(inputs["a"][0]) * inputs["x"].astype(np.float64)
        return bits, exact

    def execute(self, device, plan: SlicePlan, inputs) -> tuple[np.ndarray, int]:
        program = plan.program
        device.load(program)
        load_checked(device, plan.config, plan.stream_routes(X_COLORS), f"kernel {self.name}")
        params = plan.stream_params(X_COLORS)
        params["p_a"] = np.full(plan.own.shape, int(fp.as_bits(inputs["a"])[0]))
        write_params(device, program, params)
        write_per_pe(device, np.full(plan.own.shape, plan.heap), plan.y_words(fp.as_bits(inputs["y"])))
        plan.stream_x(device, fp.as_bits(inputs["x"]), X_COLORS)
        device.launch(T_START)
        cycles = device.run()
        return plan.read_y(device), cycles
