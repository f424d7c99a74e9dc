// Link ECC for the verilator backend's engine (wse_mesh.cpp): the C++ twin of
// the link coders of hdl/link_ecc.py (docs/architecture.md 3.7), as the
// engine's tile and mesh wiring is the twin of hdl/tile.py and hdl/fabric.py.
//
// The receiving end of the link entering a tile by one port holds the
// counters and the report, and the flip armed at the sending tile (only the
// receiver's thread touches it in a run). A wavelet with no flip decodes to
// itself, so only the armed flip's wavelet is coded.

#pragma once

#include <cstdint>

struct LinkEnd {
    bool armed = false, fault = false;
    uint64_t flip_word = 0;
    uint32_t flip_check = 0, flip_at = 0;
    uint32_t corrected = 0, detected = 0;
    uint64_t report_word = 0;
    uint32_t report_check = 0, report_syndrome = 0, report_cycle = 0;
};

// The code: Hamming positions 1..44 of the wavelet's 38 bits (the positions
// that are not powers of two); mask[j]: the wavelet bits check bit j covers.
struct LinkCode {
    int position[38];
    uint64_t mask[6];
    LinkCode() {
        int i = 0;
        for (int pos = 1; pos <= 44; ++pos) if (pos & (pos - 1)) position[i++] = pos;
        for (int j = 0; j < 6; ++j) {
            mask[j] = 0;
            for (int b = 0; b < 38; ++b) if ((position[b] >> j) & 1) mask[j] |= uint64_t{1} << b;
        }
    }
    // The 7 check bits of a 38-bit wavelet: Hamming bits 0..5, overall parity bit 6.
    uint32_t check(uint64_t word) const {
        uint32_t h = 0;
        for (int j = 0; j < 6; ++j) h |= static_cast<uint32_t>(__builtin_popcountll(word & mask[j]) & 1) << j;
        return h | static_cast<uint32_t>((__builtin_popcountll(word) + __builtin_popcount(h)) & 1) << 6;
    }
};
inline const LinkCode kLinkCode;

// A host write of LINK register `reg` (hdl/link_ecc.py LINK_REGS) of a port:
// the flip registers (5..7) go to the receiving end of the link leaving by the
// port (`out`, null on the mesh edge), the counters (0, 1) to the end of the
// link entering by it (`in`). Returns whether the port's fault was cleared.
inline bool link_write(LinkEnd& in, LinkEnd* out, uint32_t reg, uint32_t wdata) {
    if (reg >= 5) {
        if (out == nullptr) return false;
        if (reg == 5) out->flip_word = (out->flip_word & ~uint64_t{0xFFFFFFFF}) | wdata;
        if (reg == 6) {
            out->flip_word = (out->flip_word & 0xFFFFFFFF) | uint64_t{wdata & 0x3F} << 32;
            out->flip_check = (wdata >> 6) & 0x7F;
        }
        if (reg == 7) {
            out->flip_at = wdata;
            out->armed = true;
        }
        return false;
    }
    if (reg == 0) in.corrected = wdata;
    if (reg == 1) {
        in.detected = wdata;
        in.fault = false;
        return true;
    }
    return false;
}

// A host read of LINK register `reg` of the link entering by a port (0 for the flip registers).
inline uint32_t link_read(const LinkEnd& e, uint32_t reg) {
    switch (reg) {
        case 0: return e.corrected;
        case 1: return e.detected;
        case 2: return static_cast<uint32_t>(e.report_word);
        case 3:
            return static_cast<uint32_t>(e.report_word >> 32) | e.report_check << 6 | e.report_syndrome << 13 |
                   uint32_t{e.fault} << 31;
        case 4: return e.report_cycle;
        default: return 0;
    }
}

// A wavelet crossing a link whose flip is armed, in run cycle `cycle`: from
// the flip's cycle on, flip it, decode it, count, correct `payload` or drop
// it (`valid` low) and latch the report. Returns whether it was uncorrectable.
inline bool link_cross(LinkEnd& e, uint64_t cycle, uint8_t& valid, uint64_t& payload) {
    if (cycle < e.flip_at) return false;
    e.armed = false;
    const uint64_t word = payload ^ e.flip_word;
    const uint32_t check = kLinkCode.check(payload) ^ e.flip_check;
    const uint32_t syndrome = (kLinkCode.check(word) ^ check) & 0x3F;
    const bool odd = (__builtin_popcountll(word) + __builtin_popcount(check)) & 1;
    if (odd && syndrome < 45) {
        uint64_t fixed = word;
        for (int b = 0; b < 38; ++b) if (kLinkCode.position[b] == static_cast<int>(syndrome)) fixed ^= uint64_t{1} << b;
        ++e.corrected;
        payload = fixed;
        return false;
    }
    if (syndrome == 0 && !odd) return false;
    ++e.detected;
    valid = 0;
    if (!e.fault) {
        e.fault = true;
        e.report_word = word;
        e.report_check = check;
        e.report_syndrome = syndrome;
        e.report_cycle = static_cast<uint32_t>(cycle);
    }
    return true;
}
