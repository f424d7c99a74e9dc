; gelu: GELU of a block of activations held by every PE, forward or backward,
; approximate='none' (erf) or 'tanh', with the transcendentals built from
; the PE's binary32 operations in the order of firmware/training/transcendental.py
; and firmware/training/transformer.py (docs/transformer.md sections 2, 3.3).
;
; Every PE holds `p_n` elements (its features x its tokens; the order does not
; matter, GELU is elementwise) in buffer X, and for the backward pass the
; upstream gradient in buffer DY. The result (y, or dx) is left in buffer A.
; `p_heap` is the first free word: the buffers follow it, `p_n` words each, in
; the order X, DY, A, B, C, D, E, F, G, NB. Nothing touches the fabric.
;
; Descriptor registers, set once: d0 = X (G inside tanh's reciprocal, DY at
; the end of a backward pass), d1..d6 = A..F, d7 = a constant (stride 0,
; its base moved onto the constant's word by setb). Floats are combined
; with vector instructions; the integer steps (exp's ftoi, itof and 2^n, the
; reciprocal's seed) run as scalar loops over the buffer.
;
; Subroutines return through a code in a register (there is no indirect
; jump): r14 for erf and tanh, r13 for exp. r12 holds p_n throughout.
;
; Variants (`p_variant`): 0 forward none, 1 forward tanh, 2 backward none,
; 3 backward tanh.

        .equ T_START, 0
        .equ R_FWD_NONE, 1      ; return codes of erf / tanh (r14)
        .equ R_BWD_NONE, 2
        .equ R_FWD_TANH, 3
        .equ R_BWD_TANH, 4
        .equ E_ERF, 1           ; return codes of exp (r13)
        .equ E_TANH, 2
        .equ E_BWD, 3

        .data
p_n:      .word 0               ; elements held here
p_heap:   .word 0               ; first free word: the buffers start here
p_variant: .word 0              ; 0 fwd none, 1 fwd tanh, 2 bwd none, 3 bwd tanh
a_f:      .word 0               ; addresses of the buffers the scalar loops walk
a_e:      .word 0
a_b:      .word 0
a_nb:     .word 0
b_x:      .dsd mem, base=0, len=0, stride=1     ; descriptors of the buffers (base, len patched)
b_dy:     .dsd mem, base=0, len=0, stride=1
b_a:      .dsd mem, base=0, len=0, stride=1
b_b:      .dsd mem, base=0, len=0, stride=1
b_c:      .dsd mem, base=0, len=0, stride=1
b_d:      .dsd mem, base=0, len=0, stride=1
b_e:      .dsd mem, base=0, len=0, stride=1
b_f:      .dsd mem, base=0, len=0, stride=1
b_g:      .dsd mem, base=0, len=0, stride=1
b_k:      .dsd mem, base=0, len=0, stride=0     ; one constant, n times
k_one:    .word 0x3F800000
k_two:    .word 0x40000000
k_mone:   .word 0xBF800000
k_half:   .word 0x3F000000
k_mtwo:   .word 0xC0000000
k_big:    .word 0x7F000000      ; 2^127 (mask_positive)
k_mclamp_erf: .word 0xC0800000  ; -ERF_CLAMP
k_mclamp_tanh: .word 0xC1200000 ; -TANH_CLAMP
k_erf_split: .word ERF_SPLIT
k_tanh_split: .word TANH_SPLIT
k_sqrt1_2: .word GELU_SQRT1_2
k_inv_sqrt_2pi: .word GELU_INV_SQRT_2PI
k_sqrt_2_pi: .word GELU_SQRT_2_PI
k_gelu_c: .word GELU_C
k_gelu_3c: .word GELU_3C
exp_log2e: .word EXP_LOG2E
exp_mhalf: .word EXP_MHALF
exp_ln2hi: .word EXP_MLN2HI
exp_ln2lo: .word EXP_MLN2LO
exp_c6:   .word EXP_C6
exp_c5:   .word EXP_C5
exp_c4:   .word EXP_C4
exp_c3:   .word EXP_C3
exp_c2:   .word EXP_C2
exp_c1:   .word EXP_C1
exp_c0:   .word EXP_C0
rcp_magic: .word RCP_MAGIC
erf_q:    .word ERF_Q0, ERF_Q1, ERF_Q2, ERF_Q3, ERF_Q4, ERF_Q5, ERF_Q6
erf_r:    .word ERF_R0, ERF_R1, ERF_R2, ERF_R3, ERF_R4, ERF_R5, ERF_R6, ERF_R7, ERF_R8, ERF_R9, ERF_R10, ERF_R11, ERF_R12
tanh_p:   .word TANH_P0, TANH_P1, TANH_P2, TANH_P3, TANH_P4, TANH_P5, TANH_P6

        .text
start:
        ld      r12, p_n(r0)
        beq     r12, r0, done           ; nothing held here
        ld      r3, p_heap(r0)          ; r3 walks the buffers
        shli    r4, r12, 16             ; the length field
        or      r5, r3, r4
        st      r5, b_x(r0)
        add     r3, r3, r12
        or      r5, r3, r4
        st      r5, b_dy(r0)
        add     r3, r3, r12
        or      r5, r3, r4
        st      r5, b_a(r0)
        add     r3, r3, r12
        st      r3, a_b(r0)
        or      r5, r3, r4
        st      r5, b_b(r0)
        add     r3, r3, r12
        or      r5, r3, r4
        st      r5, b_c(r0)
        add     r3, r3, r12
        or      r5, r3, r4
        st      r5, b_d(r0)
        add     r3, r3, r12
        st      r3, a_e(r0)
        or      r5, r3, r4
        st      r5, b_e(r0)
        add     r3, r3, r12
        st      r3, a_f(r0)
        or      r5, r3, r4
        st      r5, b_f(r0)
        add     r3, r3, r12
        or      r5, r3, r4
        st      r5, b_g(r0)
        add     r3, r3, r12
        st      r3, a_nb(r0)
        st      r4, b_k(r0)             ; base 0 for now, length n
        ldsd    d0, b_x(r0)
        ldsd    d1, b_a(r0)
        ldsd    d2, b_b(r0)
        ldsd    d3, b_c(r0)
        ldsd    d4, b_d(r0)
        ldsd    d5, b_e(r0)
        ldsd    d6, b_f(r0)
        ldsd    d7, b_k(r0)
        ld      r3, p_variant(r0)
        beq     r3, r0, fwd_none
        li      r4, 1
        beq     r3, r4, fwd_tanh
        li      r4, 2
        beq     r3, r4, bwd_none
        jmp     bwd_tanh

; forward none: y = mul(mul(x, 0.5), add(1, erf(mul(x, 1/sqrt2))))
fwd_none:
        ld      r5, k_sqrt1_2(r0)
        fmuls   d1, d0, r5              ; A = mul(x, 1/sqrt2)
        li      r14, R_FWD_NONE
        jmp     erf
fwd_none_ret:
        jmp     finish_forward

; forward tanh: y = mul(mul(x, 0.5), add(1, tanh(u)))
fwd_tanh:
        jmp     inner
fwd_tanh_inner:
        li      r14, R_FWD_TANH
        jmp     tanh
finish_forward:                         ; A = erf(..) or tanh(u)
        ld      r5, k_one(r0)
        fadds   d1, d1, r5              ; add(1, f)
        ld      r5, k_half(r0)
        fmuls   d2, d0, r5              ; B = mul(x, 0.5)
        fmul    d1, d2, d1              ; y = mul(B, add(1, f))
done:
        exit

; u = mul(add(x, mul(mul(mul(x, x), x), 0.044715)), sqrt(2/pi)) into A, then
; back to the variant's path
inner:
        fmul    d1, d0, d0
        fmul    d1, d1, d0              ; mul(mul(x, x), x)
        ld      r5, k_gelu_c(r0)
        fmuls   d1, d1, r5
        fadd    d1, d0, d1              ; add(x, ..)
        ld      r5, k_sqrt_2_pi(r0)
        fmuls   d1, d1, r5
        ld      r3, p_variant(r0)
        li      r4, 1
        beq     r3, r4, fwd_tanh_inner
        jmp     bwd_tanh_inner

; backward none:
;   cdf = mul(add(1, erf(mul(x, 1/sqrt2))), 0.5)
;   phi = mul(exp(neg(mul(mul(x, x), 0.5))), 1/sqrt(2 pi))
;   dx  = mul(dy, add(cdf, mul(x, phi)))
bwd_none:
        ld      r5, k_sqrt1_2(r0)
        fmuls   d1, d0, r5
        li      r14, R_BWD_NONE
        jmp     erf
bwd_none_ret:
        ld      r5, k_one(r0)
        fadds   d1, d1, r5
        ld      r5, k_half(r0)
        fmuls   d1, d1, r5              ; A = cdf
        fmul    d5, d0, d0
        fmuls   d5, d5, r5
        ld      r5, k_mone(r0)
        fmuls   d5, d5, r5              ; E = neg(mul(mul(x, x), 0.5))
        li      r13, E_BWD
        jmp     exp
bwd_none_exp:
        ld      r5, k_inv_sqrt_2pi(r0)
        fmuls   d5, d5, r5              ; E = phi
        fmul    d5, d0, d5              ; mul(x, phi)
        fadd    d1, d1, d5              ; d = add(cdf, ..)
        jmp     finish_backward

; backward tanh:
;   t = tanh(u);  s = sub(1, mul(t, t))
;   du = mul(add(1, mul(mul(x, x), 3*0.044715)), sqrt(2/pi))
;   dx = mul(dy, add(mul(add(1, t), 0.5), mul(mul(mul(x, 0.5), s), du)))
bwd_tanh:
        jmp     inner
bwd_tanh_inner:
        li      r14, R_BWD_TANH
        jmp     tanh
bwd_tanh_ret:
        fmul    d2, d1, d1
        li      r5, k_one
        setb    d7, r5
        fsub    d2, d7, d2              ; B = s
        fmul    d3, d0, d0
        ld      r5, k_gelu_3c(r0)
        fmuls   d3, d3, r5
        ld      r5, k_one(r0)
        fadds   d3, d3, r5
        ld      r5, k_sqrt_2_pi(r0)
        fmuls   d3, d3, r5              ; C = du
        ld      r5, k_half(r0)
        fmuls   d4, d0, r5
        fmul    d4, d4, d2
        fmul    d4, d4, d3              ; D = mul(mul(mul(x, 0.5), s), du)
        ld      r4, k_one(r0)
        fadds   d1, d1, r4
        fmuls   d1, d1, r5              ; mul(add(1, t), 0.5)
        fadd    d1, d1, d4              ; d
finish_backward:
        ldsd    d0, b_dy(r0)
        fmul    d1, d0, d1              ; dx = mul(dy, d)
        exit

; erf of A into A (uses B..F):
;   x = max(min(x, 4), -4);  small = mul(x, Q(mul(x, x)))
;   a = |x|;  e = exp(neg(mul(a, a)));  large = mul(sub(1, mul(e, R(a))), sign(x))
;   erf = select(mask_positive(sub(0.875, a)), small, large)
erf:
        ld      r4, k_mone(r0)
        ld      r5, k_mclamp_erf(r0)
        fmuls   d2, d1, r4
        fmaxs   d2, d2, r5
        fmuls   d2, d2, r4              ; min(x, 4)
        fmaxs   d1, d2, r5              ; A = x clamped
        fmul    d2, d1, d1              ; B = z
        ld      r5, erf_q+6(r0)
        fmuls   d3, d2, r5
        li      r6, erf_q+5
        li      r7, erf_q
erf_q_loop:                             ; p = add(mul(p, z), q_k), k = 5 .. 0
        ld      r5, 0(r6)
        fadds   d3, d3, r5
        beq     r6, r7, erf_q_done
        fmul    d3, d3, d2
        addi    r6, r6, -1
        jmp     erf_q_loop
erf_q_done:
        fmul    d3, d1, d3              ; C = small
        fmuls   d4, d1, r4
        fmax    d4, d1, d4              ; D = a
        fmul    d5, d4, d4
        fmuls   d5, d5, r4              ; E = neg(mul(a, a))
        li      r13, E_ERF
        jmp     exp
erf_exp:
        ld      r5, erf_r+12(r0)
        fmuls   d2, d4, r5
        li      r6, erf_r+11
        li      r7, erf_r
erf_r_loop:                             ; B = R(a)
        ld      r5, 0(r6)
        fadds   d2, d2, r5
        beq     r6, r7, erf_r_done
        fmul    d2, d2, d4
        addi    r6, r6, -1
        jmp     erf_r_loop
erf_r_done:
        fmul    d2, d5, d2
        li      r5, k_one
        setb    d7, r5
        fsub    d2, d7, d2              ; B = large = sub(1, mul(e, R(a)))
        ld      r4, k_big(r0)               ; E = sign(x) = sub(mul(mask_positive(x), 2), 1)
        fmuls   d5, d1, r4
        ld      r4, k_mone(r0)
        fmuls   d5, d5, r4
        fmaxs   d5, d5, r4
        fmuls   d5, d5, r4
        fmaxs   d5, d5, r0
        ld      r5, k_two(r0)
        fmuls   d5, d5, r5
        fadds   d5, d5, r4              ; sub(.., 1)
        fmul    d2, d2, d5              ; large = mul(large, sign(x))
        li      r5, k_erf_split
        setb    d7, r5
        fsub    d5, d7, d4              ; E = sub(0.875, a)
        jmp     select
; A = select(mask_positive(E), small C, large B)
select:
        ld      r5, k_big(r0)
        fmuls   d5, d5, r5
        fmuls   d5, d5, r4
        fmaxs   d5, d5, r4
        fmuls   d5, d5, r4
        fmaxs   d5, d5, r0              ; E = mask
        fmul    d3, d3, d5              ; mul(small, m)
        li      r5, k_one
        setb    d7, r5
        fsub    d5, d7, d5              ; sub(1, m)
        fmul    d2, d2, d5              ; mul(large, sub(1, m))
        fadd    d1, d3, d2
        li      r5, R_FWD_NONE
        beq     r14, r5, fwd_none_ret
        li      r5, R_BWD_NONE
        beq     r14, r5, bwd_none_ret
        li      r5, R_FWD_TANH
        beq     r14, r5, finish_forward
        jmp     bwd_tanh_ret

; tanh of A into A (uses B..G):
;   x = max(min(x, 10), -10);  z = mul(x, x);  small = add(x, mul(x, mul(z, P(z))))
;   a = |x|;  e = exp(mul(a, -2))
;   large = mul(mul(sub(1, e), reciprocal(add(1, e))), sign(x))
;   tanh = select(mask_positive(sub(0.625, a)), small, large)
tanh:
        ld      r4, k_mone(r0)
        ld      r5, k_mclamp_tanh(r0)
        fmuls   d2, d1, r4
        fmaxs   d2, d2, r5
        fmuls   d2, d2, r4
        fmaxs   d1, d2, r5              ; A = x clamped
        fmul    d2, d1, d1              ; B = z
        ld      r5, tanh_p+6(r0)
        fmuls   d3, d2, r5
        li      r6, tanh_p+5
        li      r7, tanh_p
tanh_p_loop:
        ld      r5, 0(r6)
        fadds   d3, d3, r5
        beq     r6, r7, tanh_p_done
        fmul    d3, d3, d2
        addi    r6, r6, -1
        jmp     tanh_p_loop
tanh_p_done:
        fmul    d3, d2, d3              ; mul(z, P)
        fmul    d3, d1, d3              ; mul(x, ..)
        fadd    d3, d1, d3              ; C = small
        fmuls   d4, d1, r4
        fmax    d4, d1, d4              ; D = a
        ld      r5, k_mtwo(r0)
        fmuls   d5, d4, r5              ; E = mul(a, -2)
        li      r13, E_TANH
        jmp     exp
tanh_exp:
        ld      r5, k_one(r0)
        fadds   d2, d5, r5              ; B = s = add(1, e)
        li      r5, k_one
        setb    d7, r5
        fsub    d5, d7, d5              ; E = sub(1, e)
; F = reciprocal(B): y = RCP_MAGIC - bits(s); twice y = mul(y, sub(2, mul(s, y)));
; once y = add(y, mul(y, sub(1, mul(s, y))))   (G is the temporary, in d0)
        ld      r6, rcp_magic(r0)
        ld      r7, a_b(r0)
        ld      r8, a_f(r0)
        add     r9, r12, r0
rcp_seed:
        ld      r5, 0(r7)
        sub     r5, r6, r5
        st      r5, 0(r8)
        addi    r7, r7, 1
        addi    r8, r8, 1
        addi    r9, r9, -1
        bne     r9, r0, rcp_seed
        ldsd    d0, b_g(r0)
        li      r5, k_two
        setb    d7, r5
        fmul    d0, d2, d6
        fsub    d0, d7, d0
        fmul    d6, d6, d0
        fmul    d0, d2, d6
        fsub    d0, d7, d0
        fmul    d6, d6, d0
        li      r5, k_one
        setb    d7, r5
        fmul    d0, d2, d6
        fsub    d0, d7, d0
        fmul    d0, d6, d0
        fadd    d6, d6, d0              ; F = reciprocal(add(1, e))
        ldsd    d0, b_x(r0)
        fmul    d5, d5, d6              ; E = large
        ld      r5, k_big(r0)
        fmuls   d2, d1, r5              ; B = sign(x)
        fmuls   d2, d2, r4
        fmaxs   d2, d2, r4
        fmuls   d2, d2, r4
        fmaxs   d2, d2, r0
        ld      r5, k_two(r0)
        fmuls   d2, d2, r5
        fadds   d2, d2, r4
        fmul    d2, d5, d2              ; B = large = mul(large, sign(x))
        li      r5, k_tanh_split
        setb    d7, r5
        fsub    d5, d7, d4              ; E = sub(0.625, a)
        jmp     select

; exp of E into E (uses F and NB), E <= 0 (firmware/training/numerics.py):
;   n = ftoi(add(mul(x, log2e), -0.5));  nf = itof(n)
;   r = add(add(x, mul(nf, -ln2hi)), mul(nf, -ln2lo));  p = c0 + r (c1 + r (.. c6))
;   e = bits(p) + n * 2^23 where the exponent field stays positive, else +0
exp:
        ld      r5, exp_log2e(r0)
        fmuls   d6, d5, r5              ; F = t
        ld      r6, exp_mhalf(r0)
        ld      r7, a_f(r0)
        ld      r8, a_nb(r0)
        add     r9, r12, r0
exp_round:
        ld      r5, 0(r7)
        sfadd   r5, r5, r6
        ftoi    r5, r5
        st      r5, 0(r8)
        itof    r5, r5
        st      r5, 0(r7)
        addi    r7, r7, 1
        addi    r8, r8, 1
        addi    r9, r9, -1
        bne     r9, r0, exp_round
        ld      r5, exp_ln2hi(r0)
        fmacs   d5, d5, d6, r5          ; r = x + nf * -ln2hi
        ld      r5, exp_ln2lo(r0)
        fmacs   d5, d5, d6, r5          ; r = r + nf * -ln2lo
        ld      r5, exp_c6(r0)
        fmuls   d6, d5, r5
        ld      r5, exp_c5(r0)
        fadds   d6, d6, r5
        fmul    d6, d6, d5
        ld      r5, exp_c4(r0)
        fadds   d6, d6, r5
        fmul    d6, d6, d5
        ld      r5, exp_c3(r0)
        fadds   d6, d6, r5
        fmul    d6, d6, d5
        ld      r5, exp_c2(r0)
        fadds   d6, d6, r5
        fmul    d6, d6, d5
        ld      r5, exp_c1(r0)
        fadds   d6, d6, r5
        fmul    d6, d6, d5
        ld      r5, exp_c0(r0)
        fadds   d6, d6, r5              ; F = p
        ld      r7, a_f(r0)
        ld      r8, a_nb(r0)
        ld      r10, a_e(r0)
        add     r9, r12, r0
exp_scale:
        ld      r5, 0(r8)               ; n
        ld      r6, 0(r7)               ; p
        shri    r11, r6, 23
        add     r11, r11, r5            ; the exponent field of p * 2^n
        slt     r11, r0, r11            ; 1 if it is normal, else 0 (flushed)
        shli    r5, r5, 23
        add     r6, r6, r5
        mul     r6, r6, r11
        st      r6, 0(r10)
        addi    r7, r7, 1
        addi    r8, r8, 1
        addi    r10, r10, 1
        addi    r9, r9, -1
        bne     r9, r0, exp_scale
        li      r5, E_ERF
        beq     r13, r5, erf_exp
        li      r5, E_TANH
        beq     r13, r5, tanh_exp
        jmp     bwd_none_exp

        .task T_START, start
