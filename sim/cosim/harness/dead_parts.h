// Dead parts for the verilator backend's engine (wse_mesh.cpp): the C++ twin
// of the DEAD host space of hdl/tile.py (docs/faults.md section 3.3), as the
// engine's tile and mesh wiring is the twin of hdl/tile.py and hdl/fabric.py.
//
// A tile's dead mask: bit p the link by mesh port p (N, E, S, W = 0..3), bit
// 4 the PE. A dead PE is never enabled and its RAMP links carry nothing
// (valid and ready low both ways); a dead port's link carries nothing either
// way. The mask resets to 0.

#pragma once

#include <cstdint>

constexpr uint32_t kDeadSpace = 6;  // HostSpace.DEAD
constexpr uint8_t kDeadPe = 1u << 4;

// A host request of the DEAD space: address 0 reads or writes the mask; others read 0.
inline uint32_t dead_host(uint8_t& dead, uint32_t addr, bool we, uint32_t wdata) {
    if (addr != 0) return 0;
    if (we) dead = static_cast<uint8_t>(wdata & 0x1F);
    return we ? 0 : dead;
}

// Whether the link by port `p` (0..3 a mesh port, 4 the PE's RAMP) carries nothing.
inline bool dead_link(uint8_t dead, int p) { return (dead >> p) & 1; }
