"""The PE's binary32 floating-point unit.

Combinational building blocks (:class:`FPAdd`, :class:`FPMul`, :class:`FPMax`,
:class:`FPLt`, :class:`FToI`, :class:`IToF`) that the PE instantiates in its
scalar and vector datapaths, and :class:`FPU`, the pipelined add / multiply /
multiply-accumulate unit behind a pair of streams.

Every block gives, bit for bit, the result of the same-named function of
:mod:`wse.numerics`: subnormal operands are read as zero of the
same sign; add, subtract and multiply round to nearest even with gradual
underflow and then replace a subnormal result by zero of the same sign; overflow
gives a signed infinity; every NaN result is ``0x7fc00000``.

Values travel as raw 32-bit patterns (``unsigned(32)``), the form they have in
registers, memory and wavelets.
"""

from amaranth import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = [
    "CANONICAL_NAN", "FPAdd", "FPMul", "FPMax", "FPLt", "FToI", "IToF",
    "FPUOp", "FPURequest", "FPU",
]

#: The one NaN any block produces.
CANONICAL_NAN = 0x7FC00000

_SIGN = 0x80000000
_INF = 0x7F800000
_EXP_MAX = 0xFF
_BIAS = 127
_INT_MAX = 0x7FFFFFFF
_INT_MIN = 0x80000000


class _Operand:
    """An operand after the input flush, split into the fields the datapaths use.

    ``sig`` is the 24-bit significand with its hidden bit (zero for a zero);
    ``sign`` is inverted when ``negate`` is given (the subtrahend of a subtract).
    """

    def __init__(self, m, name, bits, negate=None):
        self.bits = Signal(32, name=f"{name}_flushed")
        # A zero exponent field is zero or subnormal: both read as signed zero.
        m.d.comb += self.bits.eq(Mux(bits[23:31] == 0, bits & _SIGN, bits))
        self.sign = self.bits[31] if negate is None else self.bits[31] ^ negate
        self.exp = self.bits[23:31]
        self.man = self.bits[:23]
        self.magnitude = self.bits[:31]
        self.is_zero = self.exp == 0
        self.is_inf = (self.exp == _EXP_MAX) & (self.man == 0)
        self.is_nan = (self.exp == _EXP_MAX) & (self.man != 0)
        self.sig = Cat(self.man, ~self.is_zero)


def _normalize(m, name, value):
    """Shift ``value`` (32 bits) left until bit 31 is set.

    Returns ``(normalized, zeros)``: the shifted value and the number of
    leading zeros removed (31 with a zero ``normalized`` for a zero input).
    """
    assert len(value) == 32
    current, zeros = value, []
    for step in (16, 8, 4, 2, 1):
        top_zero = Signal(name=f"{name}_lz{step}")
        shifted = Signal(32, name=f"{name}_norm{step}")
        m.d.comb += [
            top_zero.eq(current[32 - step:] == 0),
            shifted.eq(Mux(top_zero, current << step, current)),
        ]
        zeros.append(top_zero)
        current = shifted
    return current, Cat(*reversed(zeros))


def _round_pack(m, name, sign, exp, sig, guard, sticky):
    """Round a nonzero finite value to binary32 the way :mod:`numerics` does.

    The value is ``sig * 2**(exp - 150) * (1 + r)`` with ``sig`` a 24-bit
    significand whose top bit is set, ``exp`` the signed biased exponent of that
    top bit, and the bits below ``sig`` summarised as ``guard`` (the half-ulp bit)
    and ``sticky`` (any bit below it).

    Results whose gradual-underflow rounding is subnormal become signed zero. For
    ``exp == 0`` (values in ``[2**-127, 2**-126)``) the subnormal grid is one bit
    coarser than ``sig``, and rounding reaches ``2**-126`` exactly when ``sig`` is
    all ones, whatever lies below: the tie at ``2**-126 - 2**-150`` rounds to the
    even neighbour ``2**-126``. Rounding with an unbounded exponent would get
    that tie wrong, hence the explicit case.
    """
    rounded = Signal(25, name=f"{name}_rounded")
    exp_rounded = Signal(signed(len(exp) + 1), name=f"{name}_exp_rounded")
    result = Signal(32, name=f"{name}_packed")
    m.d.comb += [
        rounded.eq(sig + (guard & (sticky | sig[0]))),
        # A carry out leaves the significand as 1.000..., so the mantissa field is zero.
        exp_rounded.eq(exp + rounded[24]),
    ]
    with m.If(exp >= 1):
        with m.If(exp_rounded >= _EXP_MAX):
            m.d.comb += result.eq(Cat(Const(_INF, 31), sign))
        with m.Else():
            m.d.comb += result.eq(Cat(rounded[:23], exp_rounded[:8], sign))
    with m.Elif((exp == 0) & (sig == 0xFFFFFF)):
        m.d.comb += result.eq(Cat(Const(0, 23), Const(1, 8), sign))
    with m.Else():
        m.d.comb += result.eq(Cat(Const(0, 31), sign))
    return result


def _less(m, name, a, b):
    """IEEE ``a < b`` for flushed operands that are not NaN (``-0 < +0`` is false)."""
    less = Signal(name=f"{name}_less")
    both_zero = a.is_zero & b.is_zero
    by_magnitude = Mux(a.sign, a.magnitude > b.magnitude, a.magnitude < b.magnitude)
    m.d.comb += less.eq(~both_zero & Mux(a.sign != b.sign, a.sign, by_magnitude))
    return less


class FPAdd(wiring.Component):
    """Binary32 adder / subtractor (:func:`numerics.add` / :func:`numerics.sub`).

    Members
    -------
    a, b : ``In(32)``
        Operand bit patterns.
    sub : ``In(1)``
        When set, compute ``a - b`` instead of ``a + b``.
    result : ``Out(32)``
        The sum (or difference) bit pattern, combinationally.
    """

    a: In(32)
    b: In(32)
    sub: In(1)
    result: Out(32)

    def elaborate(self, platform):
        m = Module()
        a = _Operand(m, "a", self.a)
        b = _Operand(m, "b", self.b, negate=self.sub)

        # Order by magnitude so that the aligned sum or difference is never negative.
        swap = Signal()
        big_sign, big_exp, big_sig = Signal(), Signal(8), Signal(24)
        small_sign, small_exp, small_sig = Signal(), Signal(8), Signal(24)
        m.d.comb += [
            swap.eq(a.magnitude < b.magnitude),
            Cat(big_sign, big_exp, big_sig).eq(
                Mux(swap, Cat(b.sign, b.exp, b.sig), Cat(a.sign, a.exp, a.sig))),
            Cat(small_sign, small_exp, small_sig).eq(
                Mux(swap, Cat(a.sign, a.exp, a.sig), Cat(b.sign, b.exp, b.sig))),
        ]

        # Align: 24 significand bits, guard, round and sticky. Beyond 27 places the
        # smaller operand only contributes to the sticky bit.
        distance = Signal(8)
        shift = Signal(5)
        aligned = Signal(24 + 3 + 32)
        small_ext = Signal(27)
        big_ext = Signal(27)
        m.d.comb += [
            distance.eq(big_exp - small_exp),
            shift.eq(Mux(distance > 27, 27, distance)),
            aligned.eq(Cat(Const(0, 32 + 3), small_sig) >> shift),
            small_ext.eq(Cat(aligned[32] | aligned[:32].any(), aligned[33:])),
            big_ext.eq(Cat(Const(0, 3), big_sig)),
        ]

        total = Signal(28)
        with m.If(big_sign != small_sign):
            m.d.comb += total.eq(big_ext - small_ext)
        with m.Else():
            m.d.comb += total.eq(big_ext + small_ext)

        # Bit 27 of ``total`` is the place of 2**(big_exp + 1); padding to 32 bits
        # puts it at bit 31 of the normalized value.
        normalized, zeros = _normalize(m, "sum", Cat(Const(0, 4), total))
        big_exp_s = Signal(signed(10))
        exp = Signal(signed(10))
        m.d.comb += [
            big_exp_s.eq(big_exp),
            exp.eq(big_exp_s + 1 - zeros),
        ]
        packed = _round_pack(m, "sum", big_sign, exp, normalized[8:32], normalized[7],
                             normalized[:7].any())

        with m.If(a.is_nan | b.is_nan | (a.is_inf & b.is_inf & (a.sign != b.sign))):
            m.d.comb += self.result.eq(CANONICAL_NAN)
        with m.Elif(a.is_inf):
            m.d.comb += self.result.eq(Cat(Const(_INF, 31), a.sign))
        with m.Elif(b.is_inf):
            m.d.comb += self.result.eq(Cat(Const(_INF, 31), b.sign))
        with m.Elif(total == 0):
            # An exact zero is -0 only when both addends are -0 (round to nearest).
            m.d.comb += self.result.eq(Cat(Const(0, 31), a.sign & b.sign))
        with m.Else():
            m.d.comb += self.result.eq(packed)
        return m


class FPMul(wiring.Component):
    """Binary32 multiplier (:func:`numerics.mul`).

    Members
    -------
    a, b : ``In(32)``
        Operand bit patterns.
    result : ``Out(32)``
        The product bit pattern, combinationally.
    """

    a: In(32)
    b: In(32)
    result: Out(32)

    def elaborate(self, platform):
        m = Module()
        a = _Operand(m, "a", self.a)
        b = _Operand(m, "b", self.b)
        sign = a.sign ^ b.sign

        # Both significands have their top bit set, so the product's top bit is
        # bit 47 or bit 46.
        product = Signal(48)
        top = Signal()
        a_exp, b_exp, exp = Signal(signed(11)), Signal(signed(11)), Signal(signed(11))
        m.d.comb += [
            product.eq(a.sig * b.sig),
            top.eq(product[47]),
            a_exp.eq(a.exp),
            b_exp.eq(b.exp),
            exp.eq(a_exp + b_exp - _BIAS + top),
        ]
        packed = _round_pack(
            m, "product", sign, exp,
            Mux(top, product[24:48], product[23:47]),
            Mux(top, product[23], product[22]),
            Mux(top, product[:23].any(), product[:22].any()))

        with m.If(a.is_nan | b.is_nan | (a.is_inf & b.is_zero) | (a.is_zero & b.is_inf)):
            m.d.comb += self.result.eq(CANONICAL_NAN)
        with m.Elif(a.is_inf | b.is_inf):
            m.d.comb += self.result.eq(Cat(Const(_INF, 31), sign))
        with m.Elif(a.is_zero | b.is_zero):
            m.d.comb += self.result.eq(Cat(Const(0, 31), sign))
        with m.Else():
            m.d.comb += self.result.eq(packed)
        return m


class FPMax(wiring.Component):
    """Binary32 maximum (:func:`numerics.fmax`): NaN if either operand is NaN,
    ``+0`` beats ``-0``, a subnormal operand counts (and is returned) as zero.

    Members
    -------
    a, b : ``In(32)``
        Operand bit patterns.
    result : ``Out(32)``
        The larger operand (flushed), combinationally.
    """

    a: In(32)
    b: In(32)
    result: Out(32)

    def elaborate(self, platform):
        m = Module()
        a = _Operand(m, "a", self.a)
        b = _Operand(m, "b", self.b)
        a_less = _less(m, "a", a, b)
        b_less = _less(m, "b", b, a)
        with m.If(a.is_nan | b.is_nan):
            m.d.comb += self.result.eq(CANONICAL_NAN)
        with m.Elif(a_less):
            m.d.comb += self.result.eq(b.bits)
        with m.Elif(b_less):
            m.d.comb += self.result.eq(a.bits)
        with m.Else():
            # Equal values differ at most in the sign of a zero; clearing it picks +0.
            m.d.comb += self.result.eq(a.bits & b.bits)
        return m


class FPLt(wiring.Component):
    """Binary32 ordered less-than (:func:`numerics.lt`) on flushed operands.

    Members
    -------
    a, b : ``In(32)``
        Operand bit patterns.
    result : ``Out(1)``
        1 if ``a < b``; 0 if not or if either operand is NaN.
    """

    a: In(32)
    b: In(32)
    result: Out(1)

    def elaborate(self, platform):
        m = Module()
        a = _Operand(m, "a", self.a)
        b = _Operand(m, "b", self.b)
        m.d.comb += self.result.eq(~a.is_nan & ~b.is_nan & _less(m, "a", a, b))
        return m


class FToI(wiring.Component):
    """Binary32 to int32 (:func:`numerics.ftoi`): truncate toward zero, saturate,
    NaN gives 0.

    Members
    -------
    a : ``In(32)``
        Binary32 bit pattern.
    result : ``Out(32)``
        Two's complement int32, combinationally.
    """

    a: In(32)
    result: Out(32)

    def elaborate(self, platform):
        m = Module()
        a = _Operand(m, "a", self.a)
        # The value is sig * 2**(exp - 150); for exp in 127..157 it lies in [1, 2**31).
        magnitude = Signal(32)
        with m.If(a.exp >= 150):
            m.d.comb += magnitude.eq(a.sig << (a.exp - 150)[:3])
        with m.Else():
            m.d.comb += magnitude.eq(a.sig >> (150 - a.exp)[:5])

        with m.If(a.is_nan | (a.exp < _BIAS)):
            m.d.comb += self.result.eq(0)
        with m.Elif(a.exp >= _BIAS + 31):
            m.d.comb += self.result.eq(Mux(a.sign, _INT_MIN, _INT_MAX))
        with m.Elif(a.sign):
            m.d.comb += self.result.eq(-magnitude)
        with m.Else():
            m.d.comb += self.result.eq(magnitude)
        return m


class IToF(wiring.Component):
    """Signed int32 to binary32 (:func:`numerics.itof`), round to nearest even.

    Members
    -------
    a : ``In(32)``
        Two's complement int32.
    result : ``Out(32)``
        Binary32 bit pattern, combinationally.
    """

    a: In(32)
    result: Out(32)

    def elaborate(self, platform):
        m = Module()
        sign = self.a[31]
        magnitude = Signal(32)
        m.d.comb += magnitude.eq(Mux(sign, -self.a, self.a))
        normalized, zeros = _normalize(m, "int", magnitude)
        exp = Signal(signed(10))
        m.d.comb += exp.eq(_BIAS + 31 - zeros)
        packed = _round_pack(m, "int", sign, exp, normalized[8:32], normalized[7],
                             normalized[:7].any())
        m.d.comb += self.result.eq(Mux(magnitude == 0, 0, packed))
        return m


class FPUOp(enum.Enum, shape=2):
    """Operation of an :class:`FPU` request."""
    ADD = 0  #: ``a + b``
    SUB = 1  #: ``a - b``
    MUL = 2  #: ``a * b``
    MAC = 3  #: ``c + a * b``, rounded after the multiply and after the add


#: Payload of an :class:`FPU` request: the operation and up to three operands.
FPURequest = data.StructLayout({
    "op": FPUOp,
    "a": 32,
    "b": 32,
    "c": 32,
})


class FPU(wiring.Component):
    """Pipelined binary32 add, subtract, multiply and multiply-accumulate.

    Accepts one request per cycle and answers in order, two cycles after
    accepting it when the output is never held back. Stage 1 multiplies
    (``mul``, ``mac``) and registers the adder's operands; stage 2 adds
    (``add``, ``sub``, ``mac``) and registers the result. ``mac`` is
    :func:`numerics.mac`: ``add(c, mul(a, b))``, two roundings.

    Both streams follow the :mod:`amaranth.lib.stream` rules: ``o.valid`` and
    ``o.payload`` come from registers and hold until accepted; ``i.ready`` is
    high whenever a stage can move, and may depend on ``o.ready``.

    Members
    -------
    i : ``In(stream.Signature(FPURequest))``
        Requests.
    o : ``Out(stream.Signature(32))``
        Result bit patterns, in request order.
    """

    i: In(stream.Signature(FPURequest))
    o: Out(stream.Signature(32))

    def elaborate(self, platform):
        m = Module()
        m.submodules.multiplier = multiplier = FPMul()
        m.submodules.adder = adder = FPAdd()

        s1_valid = Signal()
        s1_op = Signal(FPUOp)
        s1_addend = Signal(32)   # first adder operand: a, or c for mac
        s1_operand = Signal(32)  # second adder operand: b, or the product
        s2_valid = Signal()
        s2_result = Signal(32)

        s2_ready = ~s2_valid | self.o.ready
        s1_ready = ~s1_valid | s2_ready
        request = self.i.payload
        m.d.comb += [
            self.i.ready.eq(s1_ready),
            multiplier.a.eq(request.a),
            multiplier.b.eq(request.b),
        ]
        with m.If(s1_ready):
            m.d.sync += [
                s1_valid.eq(self.i.valid),
                s1_op.eq(request.op),
                s1_addend.eq(Mux(request.op == FPUOp.MAC, request.c, request.a)),
                s1_operand.eq(Mux((request.op == FPUOp.MUL) | (request.op == FPUOp.MAC),
                                  multiplier.result, request.b)),
            ]

        m.d.comb += [
            adder.a.eq(s1_addend),
            adder.b.eq(s1_operand),
            adder.sub.eq(s1_op == FPUOp.SUB),
        ]
        with m.If(s2_ready):
            m.d.sync += [
                s2_valid.eq(s1_valid),
                s2_result.eq(Mux(s1_op == FPUOp.MUL, s1_operand, adder.result)),
            ]

        m.d.comb += [
            self.o.valid.eq(s2_valid),
            self.o.payload.eq(s2_result),
        ]
        return m
