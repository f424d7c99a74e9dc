"""The PE program image: code, initialized data, task table and symbols.

A :class:`Program` is what the assembler produces and what every backend
loads into a PE: ``code`` goes to instruction memory from address 0, each
``data`` segment to data memory at its word address, and ``tasks`` fill the
task table. ``symbols`` names the labels of the source so the host can find
buffers and entry points.

Binary file format (all integers little-endian)
-----------------------------------------------
====================  =========================================================
bytes                 content
====================  =========================================================
4                     magic ``b"WSEX"``
4                     u32 format version, currently 1
4                     u32 ``H``: length of the JSON header in bytes
``H``                 UTF-8 JSON header (below)
``4 * code_words``    the instruction words, u32 each
``4 * sum(n_words)``  the data words of every segment, in header order, u32 each
====================  =========================================================

The header is one JSON object::

    {"code_words": 12,
     "data": [[addr, n_words], ...],          # segments, sorted by address
     "tasks": [{"id": 0, "entry": 0, "data_color": false, "blocked": false}, ...],
     "symbols": {"name": {"section": "data", "addr": 16, "size": 4}, ...},
     "source": "kernel.s"}

Nothing follows the last data word. :meth:`Program.load` checks the magic,
the version and that the lengths add up to the file size.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path

import numpy as np

from wse.atomic import atomic_open, read_input
from wse.config import FabricConfig, UsageError

__all__ = ["TaskEntry", "Symbol", "Program", "MAGIC", "VERSION"]

MAGIC = b"WSEX"
VERSION = 1
_PREFIX = struct.Struct("<4sII")


@dataclasses.dataclass(frozen=True)
class TaskEntry:
    """One row of a PE's task table.

    Members
    -------
    id:
        Task id, ``0 .. tasks-1``.
    entry:
        Instruction address where the task starts.
    data_color:
        True for a data task bound to the color of the same number as ``id``.
    blocked:
        True if the task starts blocked (it runs only after ``unblock``).
    """
    id: int
    entry: int
    data_color: bool
    blocked: bool


@dataclasses.dataclass(frozen=True)
class Symbol:
    """A label of the program.

    Members
    -------
    name:
        The label as written in the source (case-sensitive).
    section:
        ``"text"`` (an instruction address) or ``"data"`` (a data word address).
    addr:
        The address.
    size:
        For data labels, the words from the label to the next label or the end
        of its data segment; 0 for text labels.
    """
    name: str
    section: str
    addr: int
    size: int = 0


def _as_words(values, what: str) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise UsageError(f"{what} must be a one-dimensional array of 32-bit words, not shape {array.shape}")
    if array.size and array.dtype != np.uint32:
        if not np.issubdtype(array.dtype, np.integer) or array.min() < 0 or array.max() > 0xFFFFFFFF:
            raise UsageError(f"{what} must hold 32-bit unsigned words (0 .. 0xffffffff)")
    return np.ascontiguousarray(array, dtype=np.uint32)


def _normalize_data(segments) -> list[tuple[int, np.ndarray]]:
    """Sort segments, drop empty ones, merge touching ones, reject overlaps."""
    items = []
    for addr, words in segments:
        if isinstance(addr, bool) or not isinstance(addr, (int, np.integer)) or addr < 0:
            raise UsageError(f"a data segment address must be a non-negative integer, not {addr!r}")
        words = _as_words(words, f"data segment at word {addr}")
        if words.size:
            items.append((int(addr), words))
    items.sort(key=lambda item: item[0])
    merged: list[tuple[int, np.ndarray]] = []
    for addr, words in items:
        if merged:
            prev_addr, prev_words = merged[-1]
            prev_end = prev_addr + prev_words.size
            if addr < prev_end:
                raise UsageError(f"data segments overlap: words {prev_addr}..{prev_end - 1} "
                                 f"and {addr}..{addr + words.size - 1}")
            if addr == prev_end:
                merged[-1] = (prev_addr, np.concatenate([prev_words, words]))
                continue
        merged.append((addr, words))
    return merged


@dataclasses.dataclass(eq=False)
class Program:
    """An assembled PE program.

    Parameters
    ----------
    code:
        Instruction words (``uint32``), loaded at instruction address 0.
    data:
        ``(word address, uint32 words)`` initialized data segments. They are
        sorted on construction and touching segments are merged;
        overlapping ones raise :class:`~wse.config.UsageError`.
    tasks:
        The task table entries, sorted by id on construction; ids are unique.
    symbols:
        Labels by name.
    source:
        Where the program came from (a file name), for messages.

    Two programs compare equal when all of these are equal;
    :meth:`same_image` compares only what a PE loads.
    """
    code: np.ndarray
    data: list[tuple[int, np.ndarray]] = dataclasses.field(default_factory=list)
    tasks: list[TaskEntry] = dataclasses.field(default_factory=list)
    symbols: dict[str, Symbol] = dataclasses.field(default_factory=dict)
    source: str = "<string>"

    def __post_init__(self):
        self.code = _as_words(self.code, "program code")
        self.data = _normalize_data(self.data)
        self.tasks = sorted(self.tasks, key=lambda t: t.id)
        for before, after in zip(self.tasks, self.tasks[1:]):
            if before.id == after.id:
                raise UsageError(f"task id {after.id} appears twice in the task table")
        for name, sym in self.symbols.items():
            if sym.name != name or sym.section not in ("text", "data"):
                raise UsageError(f"symbol {name!r} must be a Symbol named {name!r} in section "
                                 f"'text' or 'data', not {sym!r}")

    # Queries ----------------------------------------------------------------
    @property
    def data_words(self) -> int:
        """Initialized data words, all segments together."""
        return sum(words.size for _, words in self.data)

    @property
    def data_end(self) -> int:
        """One past the highest initialized data word address (0 without data)."""
        return max((addr + words.size for addr, words in self.data), default=0)

    def symbol(self, name: str) -> int:
        """The address of the label ``name``.

        Raises
        ------
        UsageError
            If the program has no such symbol (the message lists those it has).
        """
        sym = self.symbols.get(name)
        if sym is None:
            known = ", ".join(sorted(self.symbols)) or "(none)"
            raise UsageError(f"program has no symbol {name!r}; it has: {known}")
        return sym.addr

    def data_image(self, sram_words: int) -> np.ndarray:
        """The whole initial data memory: a ``uint32`` array of ``sram_words``
        words, the data segments in place and zeros elsewhere.

        Raises
        ------
        UsageError
            If the data does not fit in ``sram_words`` words.
        """
        if self.data_end > sram_words:
            raise UsageError(f"program {self.source} has data up to word {self.data_end - 1} "
                             f"but sram_words is {sram_words}")
        image = np.zeros(sram_words, dtype=np.uint32)
        for addr, words in self.data:
            image[addr:addr + words.size] = words
        return image

    def check_fits(self, config: FabricConfig) -> None:
        """Check the program against a fabric configuration.

        Raises
        ------
        UsageError
            If the code exceeds ``imem_words``, the data ``sram_words``, a task
            id is not below ``tasks``, or a data task's color not below ``colors``.
        """
        if self.code.size > config.imem_words:
            raise UsageError(f"program {self.source} needs {self.code.size} instruction words "
                             f"but imem_words is {config.imem_words}")
        if self.data_end > config.sram_words:
            raise UsageError(f"program {self.source} has data up to word {self.data_end - 1} "
                             f"but sram_words is {config.sram_words}")
        for task in self.tasks:
            if task.id >= config.tasks:
                raise UsageError(f"program {self.source} uses task {task.id} but tasks is {config.tasks}")
            if task.data_color and task.id >= config.colors:
                raise UsageError(f"program {self.source} binds a task to color {task.id} "
                                 f"but colors is {config.colors}")

    def same_image(self, other: "Program") -> bool:
        """True when both programs load the same code, data and task table
        (symbols and source name may differ)."""
        return (np.array_equal(self.code, other.code)
                and len(self.data) == len(other.data)
                and all(a == b and np.array_equal(x, y) for (a, x), (b, y) in zip(self.data, other.data))
                and self.tasks == other.tasks)

    def __eq__(self, other) -> bool:
        if not isinstance(other, Program):
            return NotImplemented
        return self.same_image(other) and self.symbols == other.symbols and self.source == other.source

    __hash__ = None

    # File form ----------------------------------------------------------------
    def _header(self) -> dict:
        return {
            "code_words": int(self.code.size),
            "data": [[addr, int(words.size)] for addr, words in self.data],
            "tasks": [dataclasses.asdict(t) for t in self.tasks],
            "symbols": {name: {"section": s.section, "addr": s.addr, "size": s.size}
                        for name, s in self.symbols.items()},
            "source": self.source,
        }

    def to_bytes(self) -> bytes:
        """The binary image (see the module docstring for the layout)."""
        header = json.dumps(self._header(), separators=(",", ":")).encode("utf-8")
        parts = [_PREFIX.pack(MAGIC, VERSION, len(header)), header, self.code.astype("<u4").tobytes()]
        parts += [words.astype("<u4").tobytes() for _, words in self.data]
        return b"".join(parts)

    def save(self, path) -> None:
        """Write the binary image to ``path`` atomically: the file is either
        the complete new image or untouched."""
        blob = self.to_bytes()
        with atomic_open(path) as out:
            out.write(blob)

    @classmethod
    def load(cls, path) -> "Program":
        """Read a binary image written by :meth:`save`.

        Raises
        ------
        UsageError
            If the file is missing or is not a valid version-1 image; the
            message names the file and what was expected.
        """
        path = Path(path)
        blob = read_input(path)
        return cls.from_bytes(blob, str(path))

    @classmethod
    def from_bytes(cls, blob: bytes, name: str = "<bytes>") -> "Program":
        """Parse a binary image; ``name`` is used in error messages."""
        if len(blob) < _PREFIX.size or blob[:4] != MAGIC:
            raise UsageError(f"{name} is not a waferscale program image (bad magic)")
        _, version, header_len = _PREFIX.unpack_from(blob)
        if version != VERSION:
            raise UsageError(f"{name} is a version {version} program image; expected version {VERSION}")
        body = _PREFIX.size + header_len
        if body > len(blob):
            raise UsageError(f"{name} is truncated: its header needs {header_len} bytes "
                             f"but only {len(blob) - _PREFIX.size} follow the prefix")
        try:
            header = json.loads(blob[_PREFIX.size:body].decode("utf-8"))
            code_words = int(header["code_words"])
            segments = [(int(addr), int(n)) for addr, n in header["data"]]
            tasks = [TaskEntry(int(t["id"]), int(t["entry"]), bool(t["data_color"]), bool(t["blocked"]))
                     for t in header["tasks"]]
            symbols = {str(k): Symbol(str(k), str(v["section"]), int(v["addr"]), int(v["size"]))
                       for k, v in header["symbols"].items()}
            source = str(header.get("source", name))
        except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise UsageError(f"{name} has a damaged program header ({type(exc).__name__}: {exc}); "
                             f"expected the JSON object of image version {VERSION}") from None
        if code_words < 0 or any(n < 0 for _, n in segments):
            raise UsageError(f"{name} has a damaged program header (negative lengths)")
        total = code_words + sum(n for _, n in segments)
        if len(blob) - body != 4 * total:
            raise UsageError(f"{name} has {len(blob) - body} bytes of words but its header describes "
                             f"{total} words ({4 * total} bytes)")
        words = np.frombuffer(blob, dtype="<u4", offset=body).astype(np.uint32)
        code, offset, data = words[:code_words], code_words, []
        for addr, n in segments:
            data.append((addr, words[offset:offset + n]))
            offset += n
        try:
            return cls(code=code, data=data, tasks=tasks, symbols=symbols, source=source)
        except UsageError as exc:
            raise UsageError(f"{name} is a damaged program image: {exc}") from None
