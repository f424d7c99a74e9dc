; softmax: the causal softmax of one head's scores (T queries x T keys), forward
; or backward, in the order of firmware/training/transformer.py's
; causal_softmax / causal_softmax_backward (docs/transformer.md section 3.4).
;
; Queries are dealt over the mesh rows, keys over the columns, in contiguous
; blocks: PE (x, y) holds the `p_r` queries from `p_q0` times the `p_k` keys
; from `p_k0`, key-major (the R queries of one key are contiguous). Query i
; sees keys j <= i only: for key j the rows from off = max(j - q0, 0) on; the
; rest is never read and its result is +0.
;
; A row-wide value (the max m, the sum Z, the backward's r) is a fold over
; the keys in order that runs along the mesh row as a chain: the west PE
; starts it (m = -inf, Z = +0), every PE receives the row vector from the
; west (colors `p_cin` / `p_cout`, alternating by column parity), folds its
; keys in (fmax, fadd: the same order as one PE doing every key), and sends
; it east. The east PE holds the result (for Z: its reciprocal, computed
; once per query there) and sends it back west along a second chain (colors
; `p_bin` / `p_bout`): every PE keeps a copy and passes it on.
;
; forward (S = scores, buffer S):
;   m = max_j s[i, j];  e = exp(sub(s, m));  Z = +0 + e[i, 0] + ... + e[i, i]
;   p = mul(e, reciprocal(Z))                                      -> OUT
; backward (S = p, DP = dp):
;   r = +0 + mul(p[i, 0], dp[i, 0]) + ... ;  ds = mul(mul(p, sub(dp, r)), scale)   -> OUT
;
; Buffers from `p_heap`: S, DP, E, F, OUT, NB (K*R words each), M, Z, INV, Q
; (R each). Registers: r3 = R, r4 = K, r12 = K*R; the chain takes r14 = the
; row vector's address, r15 = its initial value's address, r1 = the column
; buffer it folds, r13 = 1 max, 2 forward sum, 3 backward sum (also where it
; returns: there is no indirect jump).

        .equ T_START, 0

        .data
p_r:      .word 0               ; queries held here
p_k:      .word 0               ; keys held here
p_q0:     .word 0               ; first query
p_k0:     .word 0               ; first key
p_heap:   .word 0               ; first free word
p_variant: .word 0              ; 0 forward, 1 backward
p_first:  .word 0               ; 1 in column 0
p_last:   .word 0               ; 1 in the east column
p_cin:    .word 0               ; chain color from the west
p_cout:   .word 0               ; chain color to the east
p_bin:    .word 0               ; color of the result coming back from the east
p_bout:   .word 0               ; color it goes on to the west
p_scale:  .word 0               ; the scores' scale (backward)
a_s:      .word 0               ; buffer addresses
a_dp:     .word 0
a_e:      .word 0
a_f:      .word 0
a_out:    .word 0
a_nb:     .word 0
a_m:      .word 0
a_z:      .word 0
a_inv:    .word 0
a_q:      .word 0
t_mem:    .dsd mem, base=0, len=0, stride=1
t_k:      .dsd mem, base=0, len=0, stride=0
t_in:     .dsd fabin, color=0, len=0
t_out:    .dsd fabout, color=0, len=0
k_minf:   .word 0xFF800000
k_zero:   .word 0
k_one:    .word 0x3F800000
k_two:    .word 0x40000000
exp_log2e: .word EXP_LOG2E
exp_mhalf: .word EXP_MHALF
exp_ln2hi: .word EXP_MLN2HI
exp_ln2lo: .word EXP_MLN2LO
exp_c:    .word EXP_C0, EXP_C1, EXP_C2, EXP_C3, EXP_C4, EXP_C5, EXP_C6
rcp_magic: .word RCP_MAGIC

        .text
start:
        ld      r3, p_r(r0)
        beq     r3, r0, done            ; no queries in this mesh row
        ld      r4, p_k(r0)
        mul     r12, r3, r4
        ld      r5, p_heap(r0)
        st      r5, a_s(r0)
        add     r5, r5, r12
        st      r5, a_dp(r0)
        add     r5, r5, r12
        st      r5, a_e(r0)
        add     r5, r5, r12
        st      r5, a_f(r0)
        add     r5, r5, r12
        st      r5, a_out(r0)
        add     r5, r5, r12
        st      r5, a_nb(r0)
        add     r5, r5, r12
        st      r5, a_m(r0)
        add     r5, r5, r3
        st      r5, a_z(r0)
        add     r5, r5, r3
        st      r5, a_inv(r0)
        add     r5, r5, r3
        st      r5, a_q(r0)
        ldsd    d5, t_mem(r0)           ; d5 = E, d6 = F (whole buffers), d7 = a constant
        ld      r5, a_e(r0)
        setb    d5, r5
        setl    d5, r12
        ldsd    d6, t_mem(r0)
        ld      r5, a_f(r0)
        setb    d6, r5
        setl    d6, r12
        ldsd    d7, t_k(r0)
        ld      r5, p_variant(r0)
        bne     r5, r0, backward

; forward: m, then e = exp(sub(s, m)) for every held element, then Z and p
        ld      r14, a_m(r0)
        li      r15, k_minf
        ld      r1, a_s(r0)
        li      r13, 1
        jmp     chain
fwd_max_done:
        ldsd    d0, t_mem(r0)           ; d0 = M, d1 = a key of S, d2 = the same key of E
        ld      r5, a_m(r0)
        setb    d0, r5
        setl    d0, r3
        ldsd    d1, t_mem(r0)
        ld      r5, a_s(r0)
        setb    d1, r5
        setl    d1, r3
        ldsd    d2, t_mem(r0)
        ld      r5, a_e(r0)
        setb    d2, r5
        setl    d2, r3
        add     r8, r4, r0
        beq     r8, r0, fwd_exp_done    ; no keys here
fwd_sub:
        fsub    d2, d1, d0              ; e_arg = sub(s, m), whole key (masked rows unused)
        addb    d1, r3
        addb    d2, r3
        addi    r8, r8, -1
        bne     r8, r0, fwd_sub
; exp of E into E (F and NB are temporaries; firmware/training/numerics.py's order)
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
        ld      r5, exp_c+6(r0)
        fmuls   d6, d5, r5
        li      r6, exp_c+5
        li      r7, exp_c
exp_poly:                               ; p = add(p, c_k); p = mul(p, r) but after c0
        ld      r5, 0(r6)
        fadds   d6, d6, r5
        beq     r6, r7, exp_poly_done
        fmul    d6, d6, d5
        addi    r6, r6, -1
        jmp     exp_poly
exp_poly_done:
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
fwd_exp_done:
        ld      r14, a_z(r0)
        li      r15, k_zero
        ld      r1, a_e(r0)
        li      r13, 2
        jmp     chain
fwd_sum_done:                           ; Z holds reciprocal(Z) on every PE of the row
        jmp     clear_out
fwd_clear_done:
        li      r6, 0
        ld      r7, p_k0(r0)
        ld      r5, p_q0(r0)
        sub     r7, r7, r5
        add     r8, r4, r0
fp_loop:                                ; p = mul(e, inv) on the visible rows of each key
        beq     r8, r0, done
        add     r9, r7, r0
        bge     r9, r0, fp_off
        li      r9, 0
fp_off:
        sub     r10, r3, r9
        bge     r0, r10, done
        add     r11, r6, r9
        ld      r5, a_e(r0)
        add     r5, r5, r11
        setb    d1, r5
        setl    d1, r10
        ld      r5, a_z(r0)
        add     r5, r5, r9
        setb    d2, r5
        setl    d2, r10
        ld      r5, a_out(r0)
        add     r5, r5, r11
        setb    d0, r5
        setl    d0, r10
        fmul    d0, d1, d2
        add     r6, r6, r3
        addi    r7, r7, 1
        addi    r8, r8, -1
        jmp     fp_loop
done:
        exit

; OUT = +0 everywhere (the masked elements keep it); d0..d2 left as memory descriptors
clear_out:
        ldsd    d0, t_mem(r0)
        ld      r5, a_out(r0)
        setb    d0, r5
        setl    d0, r12
        li      r5, k_zero
        setb    d7, r5
        setl    d7, r12
        fmov    d0, d7
        ldsd    d1, t_mem(r0)
        ldsd    d2, t_mem(r0)
        ld      r5, p_variant(r0)
        beq     r5, r0, fwd_clear_done
        jmp     bwd_clear_done

; backward: E = mul(p, dp) everywhere, r = the chain's sum, then ds
backward:
        ldsd    d0, t_mem(r0)
        ld      r5, a_s(r0)
        setb    d0, r5
        setl    d0, r12
        ldsd    d1, t_mem(r0)
        ld      r5, a_dp(r0)
        setb    d1, r5
        setl    d1, r12
        fmul    d5, d0, d1
        ld      r14, a_z(r0)
        li      r15, k_zero
        ld      r1, a_e(r0)
        li      r13, 3
        jmp     chain
bwd_sum_done:                           ; Z holds r on every PE of the row
        jmp     clear_out
bwd_clear_done:
        ld      r2, p_scale(r0)
        li      r6, 0
        ld      r7, p_k0(r0)
        ld      r5, p_q0(r0)
        sub     r7, r7, r5
        add     r8, r4, r0
bp_loop:                                ; ds = mul(mul(p, sub(dp, r)), scale), visible rows
        beq     r8, r0, done
        add     r9, r7, r0
        bge     r9, r0, bp_off
        li      r9, 0
bp_off:
        sub     r10, r3, r9
        bge     r0, r10, done
        add     r11, r6, r9
        ld      r5, a_dp(r0)
        add     r5, r5, r11
        setb    d1, r5
        setl    d1, r10
        ld      r5, a_z(r0)
        add     r5, r5, r9
        setb    d2, r5
        setl    d2, r10
        ld      r5, a_f(r0)
        add     r5, r5, r11
        setb    d0, r5
        setl    d0, r10
        fsub    d0, d1, d2              ; F = sub(dp, r)
        ld      r5, a_s(r0)
        add     r5, r5, r11
        setb    d1, r5
        fmul    d0, d1, d0              ; F = mul(p, F)
        ld      r5, a_out(r0)
        add     r5, r5, r11
        setb    d2, r5
        fmuls   d2, d0, r2              ; OUT = mul(F, scale)
        add     r6, r6, r3
        addi    r7, r7, 1
        addi    r8, r8, -1
        jmp     bp_loop

; The chain along the mesh row: fold the column buffer r1 into the row vector
; r14 over the visible rows of each key (r13: 1 fmax, else fadd), pass it east,
; and leave the east PE's result (for r13 = 2 its reciprocal) in r14 everywhere.
chain:
        ldsd    d0, t_mem(r0)           ; d0 = the row vector
        setb    d0, r14
        setl    d0, r3
        ld      r5, p_first(r0)
        beq     r5, r0, chain_recv
        setb    d7, r15
        setl    d7, r3
        fmov    d0, d7                  ; the initial value
        jmp     chain_keys
chain_recv:
        ldsd    d3, t_in(r0)
        ld      r5, p_cin(r0)
        setb    d3, r5
        fmov    d0, d3                  ; the fold so far, from the west
chain_keys:
        ldsd    d1, t_mem(r0)
        ldsd    d2, t_mem(r0)
        li      r6, 0
        ld      r7, p_k0(r0)
        ld      r5, p_q0(r0)
        sub     r7, r7, r5              ; j - q0 for the first key
        add     r8, r4, r0
ck_loop:
        beq     r8, r0, ck_done
        add     r9, r7, r0              ; off = max(j - q0, 0)
        bge     r9, r0, ck_off
        li      r9, 0
ck_off:
        sub     r10, r3, r9             ; visible rows of key j
        bge     r0, r10, ck_done        ; none: none for the later keys either
        add     r11, r6, r9
        add     r5, r1, r11
        setb    d1, r5
        setl    d1, r10
        add     r5, r14, r9
        setb    d2, r5
        setl    d2, r10
        li      r5, 1
        beq     r13, r5, ck_max
        fadd    d2, d2, d1
        jmp     ck_next
ck_max:
        fmax    d2, d2, d1
ck_next:
        add     r6, r6, r3
        addi    r7, r7, 1
        addi    r8, r8, -1
        jmp     ck_loop
ck_done:
        ld      r5, p_last(r0)
        bne     r5, r0, chain_last
        ldsd    d4, t_out(r0)
        ld      r5, p_cout(r0)
        setb    d4, r5
        setl    d4, r3
        fmov    d4, d0                  ; on to the east
        ldsd    d3, t_in(r0)
        ld      r5, p_bin(r0)
        setb    d3, r5
        fmov    d0, d3                  ; the result, coming back from the east
        jmp     chain_west
chain_last:
        li      r5, 2
        bne     r13, r5, chain_west
; reciprocal of Z into INV: y = RCP_MAGIC - bits(Z); twice y = mul(y, sub(2, mul(Z, y)));
; once y = add(y, mul(y, sub(1, mul(Z, y)))); then copied over Z
        ld      r6, rcp_magic(r0)
        add     r7, r14, r0
        ld      r8, a_inv(r0)
        add     r9, r3, r0
rcp_seed:
        ld      r5, 0(r7)
        sub     r5, r6, r5
        st      r5, 0(r8)
        addi    r7, r7, 1
        addi    r8, r8, 1
        addi    r9, r9, -1
        bne     r9, r0, rcp_seed
        ld      r5, a_inv(r0)
        setb    d1, r5
        setl    d1, r3
        ld      r5, a_q(r0)
        setb    d2, r5
        setl    d2, r3
        li      r5, k_two
        setb    d7, r5
        setl    d7, r3
        fmul    d2, d0, d1
        fsub    d2, d7, d2
        fmul    d1, d1, d2
        fmul    d2, d0, d1
        fsub    d2, d7, d2
        fmul    d1, d1, d2
        li      r5, k_one
        setb    d7, r5
        fmul    d2, d0, d1
        fsub    d2, d7, d2
        fmul    d2, d1, d2
        fadd    d1, d1, d2
        fmov    d0, d1                  ; Z = reciprocal(Z)
chain_west:
        ld      r5, p_first(r0)
        bne     r5, r0, chain_ret       ; the west end
        ldsd    d4, t_out(r0)
        ld      r5, p_bout(r0)
        setb    d4, r5
        setl    d4, r3
        fmov    d4, d0                  ; on to the west
chain_ret:
        li      r5, 1
        beq     r13, r5, fwd_max_done
        li      r5, 2
        beq     r13, r5, fwd_sum_done
        jmp     bwd_sum_done

        .task T_START, start
