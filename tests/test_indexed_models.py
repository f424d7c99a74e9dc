"""``fmacx`` and ``fdotx`` on every model: the directed co-simulation program ``indexed`` in lockstep with
the golden model on the vectorized model (compiled loop, array stepper, torch on the CPU), and the
golden model's faults with the same messages there. (The RTL: ``tests/test_indexed_rtl.py`` and the
co-simulation tests, which run every directed program.)"""

from __future__ import annotations

import pytest

from wse.config import FabricConfig, Port
from wse.firmware.asm import assemble
from wse.sim.cosim.lockstep import Lockstep
from wse.sim.cosim.programs import directed_scenarios, run_scenario
from wse.sim.golden import Fabric, ProgramFault
from wse.sim.vector import VectorFabric
from wse.sim.vector.torch_fabric import TorchFabric

MAKERS = {"compiled": lambda cfg: VectorFabric(cfg), "arrays": lambda cfg: VectorFabric(cfg, stepper="arrays"),
          "torch": lambda cfg: TorchFabric(cfg)}


@pytest.mark.parametrize("form", sorted(MAKERS))
def test_indexed_program_in_lockstep_with_golden(form):
    (scenario,) = [s for s in directed_scenarios() if s.name == "indexed"]
    lockstep = Lockstep(Fabric(scenario.config), MAKERS[form](scenario.config))
    cycles = run_scenario(lockstep, scenario)
    assert cycles > 0 and lockstep.compared["memory words"] > 0


@pytest.mark.parametrize("descriptors,instruction,wavelets", [
    ("dd: .dsd mem, base=a, len=4\nda: .dsd mem, base=a, len=4\ndb: .dsd mem, base=a, len=4", "fmacx d0, d1, d2, 1, r3",
     [(0, 0)]),
    ("dd: .dsd mem, base=a, len=4\nda: .dsd mem, base=a, len=4\ndb: .dsd fabin, color=2, len=0",
     "fdotx d0, d1, d2, 1, r3", [(0, 0)]),
    ("dd: .dsd fabin, color=2, len=4\nda: .dsd mem, base=a, len=4\ndb: .dsd fabin, color=2, len=0",
     "fmacx d0, d1, d2, 1, r3", [(0, 0)]),
    ("dd: .dsd mem, base=a, len=4\nda: .dsd mem, base=a, len=4\ndb: .dsd fabin, color=2, len=0",
     "fmacx d0, d1, d2, 6, r3", [(0, 0)]),
    ("dd: .dsd mem, base=a, len=0\nda: .dsd mem, base=a, len=0\ndb: .dsd fabin, color=2, len=0",
     "fmacx d0, d1, d2, 1, r3", [(0, 0)]),
    ("dd: .dsd mem, base=a, len=1\nda: .dsd mem, base=a, len=4\ndb: .dsd mem, base=a+254, len=4",
     "fdotx d0, d1, d2, 1, r3", [(0, 0)]),
    ("dd: .dsd mem, base=a, len=4\nda: .dsd mem, base=a, len=4\ndb: .dsd fabin, color=2, len=0",
     "fmacx d0, d1, d2, 1, r3", [(253, 0)]),
], ids=["fmacx-db", "fdotx-db", "kinds", "color", "empty", "fdotx-span", "index-span"])
@pytest.mark.parametrize("form", sorted(MAKERS))
def test_indexed_faults_equal_golden(descriptors, instruction, wavelets, form):
    cfg = FabricConfig(width=1, height=1, sram_words=256, colors=4)
    program = assemble(f"""
    .data
    a:  .float 1.0, 2.0, 3.0, 4.0
    {descriptors}
    .text
    .task 0, main
    main:
        ldsd d0, dd(r0)
        ldsd d1, da(r0)
        ldsd d2, db(r0)
        {instruction}
        exit
    """, config=FabricConfig(width=1, height=1, sram_words=256, colors=8))
    messages = []
    for device in (Fabric(cfg), MAKERS[form](cfg)):
        device.load(program)
        device.set_route(0, 0, 1, Port.W, [Port.RAMP])
        device.stream_in("W", 0, 1, [w for w, _ in wavelets], ctrl=[c for _, c in wavelets])
        device.launch(0)
        with pytest.raises(ProgramFault) as info:
            device.run(max_cycles=200)
        messages.append(str(info.value))
    assert messages[0] == messages[1] and ("fmacx" in messages[0] or "fdotx" in messages[0])
