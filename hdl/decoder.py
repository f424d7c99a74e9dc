"""The PE's instruction decoder, generated from the ISA table.

Nothing here lists opcodes or field positions: :data:`Opcode`, :data:`UnitCode`,
:data:`DECODED_LAYOUT` and the :class:`Decoder` logic are all built from
:data:`wse.firmware.isa.INSTRUCTIONS` and :data:`wse.firmware.isa.FORMATS`, so
adding a row to the table adds it to the decoder.
"""

import types

from amaranth import Module
from amaranth.lib import data, enum, wiring
from amaranth.lib.wiring import In, Out

from wse.firmware import isa

__all__ = ["Opcode", "UnitCode", "DECODED_LAYOUT", "FIELD_WIDTHS", "Decoder", "opcode"]


def _make_enum(name, members, shape, doc):
    def body(namespace):
        namespace["__doc__"] = doc
        for key, value in members.items():
            namespace[key] = value
    return types.new_class(name, (enum.Enum,), {"shape": shape}, body)


#: The opcode field, one member per instruction of the table (upper-case mnemonic).
Opcode = _make_enum("Opcode", {ins.name.upper(): ins.opcode for ins in isa.INSTRUCTIONS},
                    isa.OPCODE_BITS, "Instruction opcodes, from ``wse.firmware.isa.INSTRUCTIONS``.")

#: The execution unit of an instruction (``wse.firmware.isa.Unit``).
UnitCode = _make_enum("UnitCode", {unit.name: index for index, unit in enumerate(isa.Unit)},
                      max(1, (len(isa.Unit) - 1).bit_length()),
                      "Execution units, from ``wse.firmware.isa.Unit``.")


def _field_widths() -> dict[str, int]:
    """Decoded width of every operand field name used by any format: immediates
    are extended to 32 bits, other fields keep their widest encoding."""
    widths: dict[str, int] = {}
    for fmt in isa.FORMATS.values():
        for f in fmt.fields:
            width = 32 if f.kind == "imm" else f.width
            widths[f.name] = max(widths.get(f.name, 0), width)
    return widths


#: Decoded width of each operand field name.
FIELD_WIDTHS: dict[str, int] = _field_widths()

#: What :class:`Decoder` produces: the opcode, whether it is known, its unit,
#: every operand field (zero where the format lacks it; immediates sign- or
#: zero-extended to 32 bits as the format says) and ``has_<field>`` flags
#: telling which fields the instruction's format has.
DECODED_LAYOUT = data.StructLayout({
    "opcode": Opcode,
    "known": 1,
    "unit": UnitCode,
    **{name: width for name, width in FIELD_WIDTHS.items()},
    **{f"has_{name}": 1 for name in FIELD_WIDTHS},
})


def opcode(name: str):
    """The :data:`Opcode` member of mnemonic ``name`` (``KeyError`` if the ISA has none)."""
    return Opcode[isa.BY_NAME[name].name.upper()]


class Decoder(wiring.Component):
    """Combinational instruction decoder.

    Members
    -------
    word : ``In(32)``
        The instruction word.
    decoded : ``Out(DECODED_LAYOUT)``
        Its fields. For an opcode the table does not define, ``known`` is 0
        and every operand field and ``has_`` flag is 0.
    """

    word: In(32)
    decoded: Out(DECODED_LAYOUT)

    def elaborate(self, platform):
        m = Module()
        word, out = self.word, self.decoded
        m.d.comb += out.opcode.eq(word[isa.OPCODE_SHIFT:isa.OPCODE_SHIFT + isa.OPCODE_BITS])
        with m.Switch(out.opcode):
            for ins in isa.INSTRUCTIONS:
                with m.Case(opcode(ins.name)):
                    m.d.comb += [
                        out.known.eq(1),
                        out.unit.eq(UnitCode[ins.unit.name]),
                    ]
                    for f in ins.format.fields:
                        raw = word[f.lo:f.hi + 1]
                        value = raw.as_signed() if f.signed else raw
                        m.d.comb += [
                            getattr(out, f.name).eq(value),
                            getattr(out, f"has_{f.name}").eq(1),
                        ]
        return m
