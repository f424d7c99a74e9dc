"""SECDED ECC on PE memory words, and memory fault injection, in the golden model.

Every 32-bit word of a PE's data memory is stored as a 39-bit code word
(``docs/architecture.md`` section 4.7): bits 0..31 are the data, bits 32..37
the six Hamming check bits and bit 38 the overall parity. The Hamming code
places the data bits at the positions 1..38 that are not powers of two (data
bit ``i`` at :data:`POSITIONS` ``[i]``) and check bit ``j`` at position
``2**j``; check bit ``j`` is the parity of the data bits whose position has
bit ``j`` set. On a read the decoder recomputes the check bits; the syndrome
(recomputed XOR stored, six bits) and the overall parity classify the word:

* syndrome 0, parity even: no error;
* parity odd: a single flip, corrected. The syndrome is the position of the
  flipped bit (0: the overall parity bit itself);
* syndrome not 0, parity even, or a syndrome naming no position: two (or
  more) flips, detected, not correctable.

**Lazy check bits.** Every write stores a whole code word, so a word that no
fault has touched holds exactly ``encode(data)`` as its check bits: the model
keeps check bits only for the words an injection touched (``{address:
stored check bits}``), and only a PE holding such words reads its memory
through :class:`EccMemory`, a view of the same buffer whose reads decode the
suspect words and whose writes forget them. A PE with no faulty word keeps
its plain array, so the fault-free model runs the same code as without ECC.

A read of a suspect word corrects a single flip, counts it in the PE's
``ecc["corrected"]`` and writes the corrected code word back (scrubbing: a
flip is counted once); a double flip counts ``ecc["detected"]`` and raises
:class:`EccError`, naming the PE, the address, the stored bits and the
syndrome. A write replaces the code word, so a flip that is overwritten
before it is read is never seen, as in hardware.

**Pending scrubs.** The RTL memory has one write port, so a scrub waits in
one of :data:`SCRUB_SLOTS` slots until a cycle without a task
(``docs/architecture.md`` section 4.7); reads see the slot's word, so the
model scrubs at once and keeps only the slots' addresses (``pe.scrub``) to
know when they are all taken. While a task runs, a correction takes the
lowest free slot; with none free its write-back is dropped: the word stays
flipped (still suspect) and the read gets its corrected data, so its next
read counts it again. A write of an address (the PE's, the host's, a flip)
frees its slot; :func:`scrub_drain` frees one slot per cycle without a task
(the PE calls it before each task selection and when an armed flip lands,
whose write cycle frees none). The order of the reads decides which words
get slots, so a PE with suspect words or taken slots reads as the RTL does:
the words of one cycle in one read call (:class:`EccMemory`, a word named
twice counting once), a vector element by element. Between runs (the host's
reads, also after a run that stopped with an error) the RTL buffer never
fills, so the model scrubs without slots; a run starts with every slot free
(:func:`scrub_reset`).
"""

from __future__ import annotations

import numpy as np

from wse.config import UsageError

from .errors import ProgramFault

__all__ = ["CODE_BITS", "CHECK_BITS", "DATA_BITS", "POSITIONS", "SCRUB_SLOTS", "EccError", "EccMemory", "decode",
           "encode", "inject", "pending", "scrub_reset", "scrub_drain", "flip_bits", "flip_masks", "report",
           "WAVELET_BITS", "LINK_CODE_BITS", "WAVELET_POSITIONS", "LinkEccError", "wavelet_check", "wavelet_decode",
           "link_flip_bits", "link_masks", "link_target", "link_report"]

DATA_BITS = 32
CHECK_BITS = 7
CODE_BITS = DATA_BITS + CHECK_BITS
#: The Hamming position (1..38) of each data bit: the positions that are not powers of two.
POSITIONS = np.array([p for p in range(1, 39) if p & (p - 1)], dtype=np.int64)
assert len(POSITIONS) == DATA_BITS
#: MASKS[j]: the data bits that check bit j covers.
MASKS = np.array([sum(1 << i for i, p in enumerate(POSITIONS) if p >> j & 1) for j in range(6)], dtype=np.uint32)
#: The data bit at each syndrome value (-1: a check bit, or no position).
_DATA_AT = np.full(64, -1, dtype=np.int64)
_DATA_AT[POSITIONS] = np.arange(DATA_BITS)

OK, CORRECTED, DETECTED = 0, 1, 2
#: Entries of the pending-scrub buffer (the RTL's ``wse.hdl.pe_ecc.SCRUB_SLOTS``).
SCRUB_SLOTS = 4


def _parity(x: np.ndarray) -> np.ndarray:
    """The parity (0 or 1) of each uint32 of ``x``."""
    return (np.bitwise_count(x) & 1).astype(np.uint32)


def encode(data) -> np.ndarray:
    """The 7 check bits (bits 0..5 Hamming, bit 6 overall parity) of each
    uint32 data word of ``data``, as a uint32 array of its shape."""
    d = np.asarray(data, dtype=np.uint32)
    check = np.zeros(d.shape, dtype=np.uint32)
    for j in range(6):
        check |= _parity(d & MASKS[j]) << np.uint32(j)
    overall = _parity(d) ^ _parity(check)
    return check | (overall << np.uint32(6))


def decode(data, check) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Decode stored code words: ``data`` (uint32) and ``check`` (7 bits each).

    Returns ``(data, check, status, syndrome)``: the corrected data and check
    bits, ``status`` per word (0 no error, 1 one flip corrected, 2 an
    uncorrectable error detected; the data and check bits of such a word are
    returned as stored) and the 6-bit syndrome."""
    d = np.asarray(data, dtype=np.uint32).copy()
    c = np.asarray(check, dtype=np.uint32).copy()
    syndrome = (encode(d) ^ c) & np.uint32(0x3F)
    odd = (_parity(d) ^ _parity(c)).astype(bool)
    status = np.where(odd, CORRECTED, np.where(syndrome != 0, DETECTED, OK))
    s = syndrome.astype(np.int64)
    in_range = s < 39
    data_bit = np.where(in_range, _DATA_AT[s], -1)
    is_check = (s & (s - 1)) == 0            # 0 (the overall parity bit) or a power of two
    status = np.where(odd & ~in_range, DETECTED, status)
    fix_data = (status == CORRECTED) & (data_bit >= 0)
    d[fix_data] ^= (np.uint32(1) << data_bit[fix_data].astype(np.uint32))
    fix_check = (status == CORRECTED) & is_check
    check_bit = np.where(s == 0, 6, np.log2(np.maximum(s, 1)).astype(np.int64))
    c[fix_check] ^= (np.uint32(1) << check_bit[fix_check].astype(np.uint32))
    return d, c, status.astype(np.int64), syndrome


def flip_bits(bits) -> list[int]:
    """``bits`` as a list of distinct code-word bit numbers (0..31 data, 32..38
    check bits); anything else is one :class:`~wse.config.UsageError` line."""
    try:
        flips = [int(b) for b in bits]
    except (TypeError, ValueError):
        flips = None
    if not flips or len(set(flips)) != len(flips) or not all(0 <= b < CODE_BITS for b in flips):
        raise UsageError(f"inject: bits must be distinct code-word bits in 0..{CODE_BITS - 1}, not {bits!r}")
    return flips


def flip_masks(bits) -> tuple[int, int]:
    """The XOR masks ``(data, check)`` that flip code-word bits ``bits``."""
    data = sum(1 << b for b in bits if b < DATA_BITS)
    check = sum(1 << (b - DATA_BITS) for b in bits if b >= DATA_BITS)
    return data, check


def report(where: str, addr: int, data: int, check: int, syndrome: int) -> str:
    """The message of an uncorrectable word (every device words it the same)."""
    return (f"{where}: uncorrectable memory error (two or more flipped bits) at data address {addr}: "
            f"stored data {data:#010x}, check bits {check:#04x}, syndrome {syndrome:#04x}")


class EccError(ProgramFault):
    """A memory word with an uncorrectable error (two flipped bits) was read.
    The message names the PE, the address, the stored data and check bits
    and the syndrome."""


class EccMemory(np.ndarray):
    """A PE's data memory while some of its words hold injected faults (or
    scrubs are pending): a view of the PE's array whose reads go through the
    decoder for the suspect words and whose writes forget them and cancel
    their pending scrubs (see the module docstring). One read call is one
    cycle's reads: a word it names twice counts once."""

    pe = None

    def __array_finalize__(self, obj) -> None:
        self.pe = getattr(obj, "pe", None)

    def __getitem__(self, index):
        pe = self.pe
        plain = self.view(np.ndarray)
        if pe is not None and pe.ecc_check:
            addrs = np.arange(len(plain))[index]
            suspect = list(dict.fromkeys(a for a in np.atleast_1d(addrs).tolist() if a in pe.ecc_check))
            if suspect:
                kept = _correct(pe, plain, suspect)
                if kept:                   # corrected for this read, still flipped in memory
                    out = plain[index]
                    if np.ndim(out) == 0:
                        return np.uint32(kept[int(addrs)])
                    out = out.copy()
                    for a, value in kept.items():
                        out[addrs == a] = value
                    return out
        return plain[index]

    def __setitem__(self, index, value) -> None:
        pe = self.pe
        plain = self.view(np.ndarray)
        plain[index] = value
        if pe is not None and (pe.ecc_check or any(s is not None for s in pe.scrub)):
            for a in np.atleast_1d(np.arange(len(plain))[index]).tolist():
                pe.ecc_check.pop(a, None)
                _cancel(pe, a)
            _detach_if_clean(pe)


def _cancel(pe, addr: int) -> None:
    """A write of ``addr`` empties its pending-scrub slot."""
    if addr in pe.scrub:
        pe.scrub[pe.scrub.index(addr)] = None


def _detach_if_clean(pe) -> None:
    if not pe.ecc_check and isinstance(pe.mem, EccMemory) and all(s is None for s in pe.scrub):
        pe.mem = pe.mem.view(np.ndarray)


def _correct(pe, plain: np.ndarray, addrs: list[int]) -> dict[int, int]:
    """Decode the distinct suspect words ``addrs`` of ``pe`` (one cycle's
    reads, in read-port order): correct, count and scrub single flips, raise
    :class:`EccError` on the first uncorrectable word. While a task runs a
    scrub takes the lowest free pending-scrub slot; with none free its
    write-back is dropped: the word stays flipped and its corrected data is
    returned in ``{address: data}`` for this read only. Outside
    :meth:`~wse.sim.golden.Fabric.run` (the host's reads, also after a run that raised)
    every scrub is written back at once."""
    a = np.array(addrs, dtype=np.int64)
    stored_d = plain[a].copy()
    stored_c = np.array([pe.ecc_check[x] for x in addrs], dtype=np.uint32)
    d, _, status, syndrome = decode(stored_d, stored_c)
    in_task = pe.running and pe.fabric.in_run     # a stopped run leaves ``running`` set until the next one
    kept = {}
    for k, addr in enumerate(addrs):
        if status[k] == DETECTED:
            pe.ecc["detected"] += 1
            where = pe.where() if in_task else f"PE ({pe.x}, {pe.y})"
            raise EccError(report(where, addr, int(stored_d[k]), int(stored_c[k]), int(syndrome[k])))
        if status[k] == CORRECTED:
            pe.ecc["corrected"] += 1
            if in_task:
                if None not in pe.scrub:
                    kept[addr] = int(d[k])
                    continue
                pe.scrub[pe.scrub.index(None)] = addr
        plain[addr] = d[k]                 # the scrubbed word: a valid code word again
        del pe.ecc_check[addr]
    _detach_if_clean(pe)
    return kept


def scrub_reset(pe) -> None:
    """A run starts with every pending-scrub slot free (the devices drain them before)."""
    pe.scrub = [None] * SCRUB_SLOTS
    pe.scrub_from = 0          # the first cycle without a task whose drain is not yet applied
    pe.scrub_skip = None       # the cycle in which an armed flip's write took the port
    if getattr(pe, "ecc_check", None) is not None:
        _detach_if_clean(pe)


def scrub_drain(pe, last: int) -> None:
    """Apply the drains of the cycles ``pe.scrub_from .. last`` (no task ran
    in them): each empties the lowest pending slot, except in the cycle of an
    armed flip's write."""
    first = pe.scrub_from
    if last < first:
        return
    cycles = last - first + 1 - (pe.scrub_skip is not None and first <= pe.scrub_skip <= last)
    for _ in range(cycles):
        busy = [j for j, s in enumerate(pe.scrub) if s is not None]
        if not busy:
            break
        pe.scrub[busy[0]] = None
    pe.scrub_from = last + 1
    _detach_if_clean(pe)


def inject(pe, addr: int, bits) -> None:
    """Flip code-word bits ``bits`` (0..31 data, 32..38 check bits) of the
    word at ``addr`` of ``pe``, as stored; the next read decodes it. The
    flip's write empties the word's pending-scrub slot."""
    plain = pe.mem.view(np.ndarray)
    _cancel(pe, addr)
    check = pe.ecc_check.get(addr)
    if check is None:
        check = int(encode(plain[addr]))
    word = int(plain[addr])
    for b in bits:
        if b < DATA_BITS:
            word ^= 1 << b
        else:
            check ^= 1 << (b - DATA_BITS)
    plain[addr] = word
    pe.ecc_check[addr] = check
    if not isinstance(pe.mem, EccMemory):
        mem = plain.view(EccMemory)
        mem.pe = pe
        pe.mem = mem


def pending(pe) -> dict[int, int]:
    """The suspect words of ``pe``: ``{address: stored check bits}``."""
    return dict(pe.ecc_check)


# ---------------------------------------------------------------------- link ECC
#: A wavelet (``docs/architecture.md`` section 2) is 38 bits: data 0..31, color 32..36, ctrl 37.
WAVELET_BITS = 38
#: On a router-to-router link a wavelet travels with 7 check bits: code-word bits 0..37 the
#: wavelet, 38..43 the six Hamming check bits, 44 the overall parity.
LINK_CODE_BITS = WAVELET_BITS + CHECK_BITS
#: The Hamming position (1..44) of each wavelet bit: the positions that are not powers of two. The
#: first 32 are :data:`POSITIONS`, so the memory word's code is this code with the top 6 bits zero.
WAVELET_POSITIONS = [p for p in range(1, 45) if p & (p - 1)]
assert len(WAVELET_POSITIONS) == WAVELET_BITS and WAVELET_POSITIONS[:DATA_BITS] == POSITIONS.tolist()
#: WAVELET_MASKS[j]: the wavelet bits that check bit j covers.
WAVELET_MASKS = [sum(1 << i for i, p in enumerate(WAVELET_POSITIONS) if p >> j & 1) for j in range(6)]
_WAVELET_AT = {p: i for i, p in enumerate(WAVELET_POSITIONS)}


def wavelet_check(word: int) -> int:
    """The 7 check bits (bits 0..5 Hamming, bit 6 overall parity) of a
    38-bit packed wavelet ``word`` (``docs/architecture.md`` section 3.7)."""
    check = 0
    for j, mask in enumerate(WAVELET_MASKS):
        check |= ((word & mask).bit_count() & 1) << j
    return check | ((word.bit_count() + check.bit_count()) & 1) << 6


def wavelet_decode(word: int, check: int) -> tuple[int, int, int]:
    """Decode a received link code word: the 38-bit ``word`` and its 7
    ``check`` bits. Returns ``(word, status, syndrome)``: the corrected
    wavelet (as received when the error is uncorrectable), ``status`` (0 no
    error, 1 one flip corrected, 2 detected, not correctable) and the 6-bit
    syndrome; the same rules as :func:`decode` with positions up to 44."""
    syndrome = (wavelet_check(word) ^ check) & 0x3F
    odd = (word.bit_count() + check.bit_count()) & 1
    if not odd:
        return word, (DETECTED if syndrome else OK), syndrome
    if syndrome > LINK_CODE_BITS - 1:
        return word, DETECTED, syndrome
    bit = _WAVELET_AT.get(syndrome)
    return (word ^ (1 << bit) if bit is not None else word), CORRECTED, syndrome


def link_flip_bits(bits) -> list[int]:
    """``bits`` as a list of one or two distinct link code-word bits (0..37
    the wavelet, 38..44 the check bits); anything else is one
    :class:`~wse.config.UsageError` line. (Three or more flips can decode as
    a wrong single-flip correction, which SECDED does not promise to see.)"""
    try:
        flips = [int(b) for b in bits]
    except (TypeError, ValueError):
        flips = None
    if not flips or len(flips) > 2 or len(set(flips)) != len(flips) \
            or not all(0 <= b < LINK_CODE_BITS for b in flips):
        raise UsageError(f"inject: link bits must be one or two distinct code-word bits in "
                         f"0..{LINK_CODE_BITS - 1}, not {bits!r}")
    return flips


def link_target(width: int, height: int, x: int, y: int, port) -> tuple[int, int, int]:
    """The link leaving router ``(x, y)`` of a ``width x height`` mesh through
    ``port`` (N, E, S or W, a name or code, toward a neighbour): ``(port
    code, neighbour x, neighbour y)``; anything else is one
    :class:`~wse.config.UsageError` line."""
    from wse.config import Port
    try:
        p = Port[port.upper()] if isinstance(port, str) else Port(port)
    except (KeyError, ValueError, TypeError, AttributeError):
        p = None
    if p is None or p is Port.RAMP or not (0 <= x < width and 0 <= y < height) \
            or not (0 <= x + p.delta[0] < width and 0 <= y + p.delta[1] < height):
        raise UsageError(f"inject: a link is N, E, S or W from a router of the {width}x{height} mesh toward a "
                         f"neighbour, not router ({x}, {y}) port {port!r}")
    return int(p), x + p.delta[0], y + p.delta[1]


def link_masks(bits) -> tuple[int, int]:
    """The XOR masks ``(wavelet, check)`` that flip link code-word bits ``bits``."""
    word = sum(1 << b for b in bits if b < WAVELET_BITS)
    check = sum(1 << (b - WAVELET_BITS) for b in bits if b >= WAVELET_BITS)
    return word, check


def link_report(x: int, y: int, port: str, nx: int, ny: int, cycle: int, word: int, check: int,
                syndrome: int) -> str:
    """The message of an uncorrectable wavelet on the link from router ``(x,
    y)`` through ``port`` to router ``(nx, ny)`` (every device words it the same)."""
    return (f"the link from router ({x}, {y}) through {port} to router ({nx}, {ny}): uncorrectable wavelet error "
            f"(two or more flipped bits) at cycle {cycle}: received color {word >> 32 & 31} (as received), "
            f"data {word & 0xFFFFFFFF:#010x}, ctrl {word >> 37 & 1}, check bits {check:#04x}, "
            f"syndrome {syndrome:#04x}")


class LinkEccError(ProgramFault):
    """A wavelet with an uncorrectable error (two flipped bits) crossed a
    link. The message names the link, the cycle, the color as received, the
    received bits and the syndrome."""
