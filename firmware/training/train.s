; train.s: the PE program of weight-streaming training (docs/weight_streaming.md).
;
; One program on every PE. A phase is one run: the host writes the address of
; the phase's op list into `phase_ops` and launches T_RUN; the task walks the
; records of the list (layout in firmware/training/records.py, which also
; defines the K_* kind codes and the XX_FIELD offsets used below) and exits
; at the `end` record. r15 points at the current record throughout.
;
; Timing never depends on data: every branch tests a record field or a loop
; counter, never a value computed from activations, so a phase takes the same
; cycles whatever the numbers are (the static cycle model relies on it).

        .equ C_W, 0             ; weight stream (west edge, multicast along rows)
        .equ T_RUN, 0           ; the one task: run the phase's op list

        .data
phase_ops: .word 0              ; op list of the phase to run (written by the host)
f_zero:   .word 0               ; +0.0: a stride-0 memory descriptor on it is a zero vector
one:      .word 0x3f800000      ; 1.0 (for the reciprocal's last step)
two:      .word 0x40000000      ; 2.0
; exp(x), x <= 0 (constants from firmware/training/numerics.py)
exp_log2e:  .word EXP_LOG2E
exp_mhalf:  .word EXP_MHALF
exp_ln2hi:  .word EXP_MLN2HI
exp_ln2lo:  .word EXP_MLN2LO
exp_c6:   .word EXP_C6
exp_c5:   .word EXP_C5
exp_c4:   .word EXP_C4
exp_c3:   .word EXP_C3
exp_c2:   .word EXP_C2
exp_c1:   .word EXP_C1
exp_c0:   .word EXP_C0
rcp_magic: .word RCP_MAGIC
mask_big: .word 0xff000000      ; -2^127
mask_m1:  .word 0xbf800000      ; -1.0

        .text
run:
        ld      r15, phase_ops(r0)
next_op:
        ld      r1, R_KIND(r15)
        beq     r1, r0, run_done
        li      r2, K_SGEMM
        beq     r1, r2, sgemm
        li      r2, K_WGRAD
        beq     r1, r2, wgrad
        li      r2, K_RELU
        beq     r1, r2, relu
        li      r2, K_TRANSPOSE
        beq     r1, r2, transpose
        li      r2, K_MASK
        beq     r1, r2, mask
        li      r2, K_SOFTMAX
        beq     r1, r2, softmax
        li      r2, K_SPGEMM
        beq     r1, r2, spgemm
        li      r2, K_SPWGRAD
        beq     r1, r2, spwgrad
        jmp     bad_kind
op_done:
        ld      r1, R_LEN(r15)
        add     r15, r15, r1
        jmp     next_op
run_done:
        exit
bad_kind:
        li      r1, -1                  ; an unknown record kind: fault on purpose
        ld      r1, 0(r1)

; ---------------------------------------------------------------------------
; relu: data = max(data, +0) in place.
relu:
        ldsd    d0, RL_DATA(r15)
        fmaxs   d0, d0, r0
        jmp     op_done

; transpose: dst[t][k] = src[k][t] (raw copies), K features by T tokens.
transpose:
        ld      r3, TR_K(r15)
        ld      r4, TR_T(r15)
        ldsd    d0, TR_DST(r15)         ; dst row t: K words, stride 1
        ldsd    d1, TR_SRC(r15)         ; src column t: K words, stride T
        li      r5, 1
        beq     r4, r0, op_done
tr_loop:
        fmov    d0, d1
        addb    d0, r3
        addb    d1, r5
        addi    r4, r4, -1
        bne     r4, r0, tr_loop
        jmp     op_done

; mask: grad = mul(mul(grad, max(mul(act, -2^127), -1)), -1), the ReLU
; derivative applied to the gradient: grad where act > 0, a zero where act == 0.
mask:
        ldsd    d0, MK_ACT(r15)
        ldsd    d1, MK_GRAD(r15)
        ldsd    d2, MK_TMP(r15)
        ld      r3, mask_big(r0)
        ld      r4, mask_m1(r0)
        fmuls   d2, d0, r3
        fmaxs   d2, d2, r4
        fmul    d1, d1, d2
        fmuls   d1, d1, r4
        jmp     op_done

; ---------------------------------------------------------------------------
; sgemm: one streamed GEMM (forward, or input gradients with W transposed).
; Rows hold K input features of T tokens (x0: row 0, x1: rows 1..K-1); each
; output o is reduced over the column in a ring that starts on the row after
; o's home row and ends on it. Within a round of H steps this PE is at ring
; position p = step: p = 0 starts (sends acc + bias), 0 < p < H-1 passes
; on (sends in + acc), p = H-1 ends (stores in + acc into y, its next output
; slot). The host streams, per step, the K weights of the step's output and,
; at p = 0 only, one control wavelet carrying the bias.
;   r3 T, r4 K, r7 first weight, r8 bias, r9 rounds (o_last in the last
;   round), r10 pairs, r11 H-2 (e_step in the last round), r12 e, r13 p, r14 H-1
sgemm:
        ld      r3, SG_T(r15)
        ld      r4, SG_K(r15)
        ld      r14, SG_H(r15)
        addi    r14, r14, -1
        addi    r11, r14, -1
        ldsd    d0, SG_ACC(r15)
        ldsd    d1, SG_ZERO(r15)
        ldsd    d2, SG_X0(r15)
        ldsd    d3, SG_X1(r15)
        ldsd    d4, SG_W(r15)
        ldsd    d5, SG_OUT(r15)
        ldsd    d6, SG_INP(r15)
        ldsd    d7, SG_Y(r15)
        ld      r9, SG_ROUNDS(r15)
        beq     r14, r0, sg_solo
        beq     r9, r0, sg_partial
        beq     r4, r0, sgz_round
sg_round:
        recv    r7, C_W                 ; p = 0: start
        fmacs   d0, d1, d2, r7
        fmacw   d0, d3, d4
        recv    r8, C_W
        fadds   d5, d0, r8
        andi    r10, r11, 1             ; an odd number of middle steps: one alone
        beq     r10, r0, sg_pairs
        recv    r7, C_W
        fmacs   d0, d1, d2, r7
        fmacw   d0, d3, d4
        fadd    d5, d6, d0
sg_pairs:
        shri    r10, r11, 1
        beq     r10, r0, sg_end
sg_mid:
        recv    r7, C_W
        fmacs   d0, d1, d2, r7
        fmacw   d0, d3, d4
        fadd    d5, d6, d0
        recv    r7, C_W
        fmacs   d0, d1, d2, r7
        fmacw   d0, d3, d4
        fadd    d5, d6, d0
        addi    r10, r10, -1
        bne     r10, r0, sg_mid
sg_end:
        recv    r7, C_W                 ; p = H-1: end
        fmacs   d0, d1, d2, r7
        fmacw   d0, d3, d4
        fadd    d7, d6, d0
        addb    d7, r3
        addi    r9, r9, -1
        bne     r9, r0, sg_round
        jmp     sg_partial
; The same rounds for a row without input features: acc is the zero vector.
sgz_round:
        recv    r8, C_W
        fadds   d5, d0, r8
        add     r10, r11, r0
        beq     r10, r0, sgz_end
sgz_mid:
        fadd    d5, d6, d0
        addi    r10, r10, -1
        bne     r10, r0, sgz_mid
sgz_end:
        fadd    d7, d6, d0
        addb    d7, r3
        addi    r9, r9, -1
        bne     r9, r0, sgz_round
; The last round, where only the steps of the o_last outputs it holds exist.
; A step is live when its counter e is below o_last; e starts at e0 and each
; step subtracts e_step (mod H): with e_step = 1, e is the step's home row and
; the live homes are rows 0 .. o_last-1 (contiguous); with e_step = H - o_last,
; e = -home * o_last mod H and the live homes are rows floor(j*H/o_last)
; (spread over the ring, docs/weight_streaming.md section 3).
sg_partial:
        ld      r9, SG_O_LAST(r15)
        beq     r9, r0, op_done
        ld      r12, SG_E0(r15)
        ld      r11, SG_E_STEP(r15)
        li      r13, 0
sgp_step:
        bge     r12, r9, sgp_next
        beq     r4, r0, sgp_ring
        recv    r7, C_W
        fmacs   d0, d1, d2, r7
        fmacw   d0, d3, d4
sgp_ring:
        beq     r13, r0, sgp_start
        beq     r13, r14, sgp_end
        fadd    d5, d6, d0
        jmp     sgp_next
sgp_start:
        recv    r8, C_W
        fadds   d5, d0, r8
        jmp     sgp_next
sgp_end:
        fadd    d7, d6, d0
sgp_next:
        sub     r12, r12, r11
        bge     r12, r0, sgp_wrapped
        add     r12, r12, r14
        addi    r12, r12, 1
sgp_wrapped:
        addi    r13, r13, 1
        bge     r14, r13, sgp_step
        jmp     op_done
; One row (H = 1): every step starts and ends its own ring.
sg_solo:
        beq     r9, r0, op_done
sgs_step:
        beq     r4, r0, sgs_ring
        recv    r7, C_W
        fmacs   d0, d1, d2, r7
        fmacw   d0, d3, d4
sgs_ring:
        recv    r8, C_W
        fadds   d7, d0, r8
        addb    d7, r3
        addi    r9, r9, -1
        bne     r9, r0, sgs_step
        jmp     op_done

; ---------------------------------------------------------------------------
; spgemm and spwgrad: the sparse streamed GEMM and weight gradients of a
; masked layer, in their own file.
        .include "train_sparse.s"

; ---------------------------------------------------------------------------
; wgrad: weight (and bias) gradients of one layer.
; The deltas dy of the layer's outputs rotate around the column ring: at step
; s this PE holds the block of row (row - s) mod H, counts[s] outputs of T
; tokens. For each output o of the block: G[k] = sum_t x[t][k] * dy[o][t]
; over the PE's features (x token-major), plus at step 0 the bias partial
; sum_t dy[o][t]; G is added into the row chain (west to east) whose east end
; leaves the mesh as the gradient row.
;   r3 T, r4 Kx, r5 current block (moving pointer), r6 receive buffer,
;   r7 other buffer, r9 s, r10 outputs left, r13 &G[Kx], r14 H-1
wgrad:
        ld      r3, WG_T(r15)
        ld      r4, WG_KX(r15)
        ld      r13, WG_GK(r15)
        ldsd    d0, WG_G(r15)
        ldsd    d1, WG_ZERO(r15)
        ldsd    d2, WG_X0(r15)
        ldsd    d3, WG_X1(r15)
        ld      r5, WG_OWN(r15)
        ld      r6, WG_BUF0(r15)
        ld      r7, WG_BUF1(r15)
        ld      r14, WG_H(r15)
        addi    r14, r14, -1
        li      r9, 0
wg_step:
        add     r10, r15, r9
        ld      r10, WG_COUNTS(r10)
        bge     r9, r14, wg_compute     ; the last step passes nothing on
        mul     r11, r10, r3            ; words of this block
        add     r12, r15, r9
        ld      r12, WG_COUNTS+1(r12)
        mul     r12, r12, r3            ; words of the next block
        ldsd    d4, WG_ROUT(r15)
        setl    d4, r11
        ldsd    d5, WG_MEM(r15)
        setb    d5, r5
        ldsd    d6, WG_RIN(r15)
        ldsd    d7, WG_MEM(r15)
        setb    d7, r6
        setl    d7, r12
        ld      r8, WG_SEND_FIRST(r15)
        beq     r8, r0, wg_recv_first
        fmov    d4, d5                  ; send this block on
        fmov    d7, d6                  ; take the next one
        jmp     wg_compute
wg_recv_first:
        fmov    d7, d6
        fmov    d4, d5
wg_compute:
        ldsd    d4, WG_DYR(r15)
        addi    r11, r5, 1
        setb    d4, r11                 ; dy[o][1 ..]
        ldsd    d5, WG_EOUT(r15)
        ldsd    d6, WG_EIN(r15)
        ldsd    d7, WG_DYO(r15)
        setb    d7, r5                  ; dy[o][0 ..]
        add     r11, r4, r0
        bne     r9, r0, wg_len
        ld      r12, WG_BIAS(r15)
        add     r11, r11, r12           ; step 0 carries the bias gradient too
wg_len:
        setl    d5, r11
        setl    d6, r11
        beq     r10, r0, wg_next
        bne     r9, r0, wg_out
        ld      r12, WG_BIAS(r15)
        bne     r12, r0, wg_outb
wg_out:
        ld      r8, 0(r5)
        fmacs   d0, d1, d2, r8          ; G = 0 + x[0] * dy[o][0]
        fmacw   d0, d3, d4              ; G += x[t] * dy[o][t], t = 1 .. T-1
        fadd    d5, d6, d0              ; east = west + G
        addb    d4, r3
        add     r5, r5, r3
        addi    r10, r10, -1
        bne     r10, r0, wg_out
        jmp     wg_next
wg_outb:
        ld      r8, 0(r5)
        fmacs   d0, d1, d2, r8
        fmacw   d0, d3, d4
        li      r12, 0
        fsum    r12, d7                 ; the bias partial: 0 + dy[o][0] + ...
        st      r12, 0(r13)
        fadd    d5, d6, d0
        addb    d4, r3
        addb    d7, r3
        add     r5, r5, r3
        addi    r10, r10, -1
        bne     r10, r0, wg_outb
wg_next:
        add     r5, r6, r0              ; the received block is the next one
        add     r6, r7, r0
        add     r7, r5, r0
        addi    r9, r9, 1
        bge     r14, r9, wg_step
        jmp     op_done

; ---------------------------------------------------------------------------
; softmax: the loss delta of softmax cross-entropy for this PE's classes.
; The logits of the column rotate around the ring (as in wgrad) and are
; placed in class order into zall[C][T]; then every PE that owns classes
; computes, per token t (float order in docs/weight_streaming.md):
;   m = max_c z[c];  x = z - m;  e = exp(x);  S = sum_c e (class order);
;   inv = 1/S;  dz[c] = (e[c] * inv - onehot[c]) * scale   for its own c.
;   r3 T, r5 current block, r6/r7 buffers, r9 s, r10 classes in block,
;   r12 the block's home row, r14 H-1
softmax:
        ld      r3, SM_T(r15)
        ld      r5, SM_OWN(r15)
        ld      r6, SM_BUF0(r15)
        ld      r7, SM_BUF1(r15)
        ld      r12, SM_ROW(r15)
        ld      r14, SM_H(r15)
        addi    r14, r14, -1
        li      r9, 0
sm_step:
        add     r10, r15, r9
        ld      r10, SM_COUNTS(r10)
        ldsd    d0, SM_TMEM(r15)        ; place the block: row u -> zall[u*H + home]
        ldsd    d1, SM_TMEM(r15)
        ld      r11, SM_ZALL(r15)
        mul     r8, r12, r3
        add     r11, r11, r8
        setb    d0, r11
        setb    d1, r5
        ld      r8, SM_HT(r15)
        add     r11, r10, r0
        beq     r11, r0, sm_placed
sm_place:
        fmov    d0, d1
        addb    d0, r8
        addb    d1, r3
        addi    r11, r11, -1
        bne     r11, r0, sm_place
sm_placed:
        bge     r9, r14, sm_rotated
        mul     r11, r10, r3
        add     r8, r15, r9
        ld      r8, SM_COUNTS+1(r8)
        mul     r8, r8, r3
        ldsd    d4, SM_ROUT(r15)
        setl    d4, r11
        ldsd    d5, SM_MEM(r15)
        setb    d5, r5
        ldsd    d6, SM_RIN(r15)
        ldsd    d7, SM_MEM(r15)
        setb    d7, r6
        setl    d7, r8
        ld      r8, SM_SEND_FIRST(r15)
        beq     r8, r0, sm_recv_first
        fmov    d4, d5
        fmov    d7, d6
        jmp     sm_rotated
sm_recv_first:
        fmov    d7, d6
        fmov    d4, d5
sm_rotated:
        add     r5, r6, r0
        add     r6, r7, r0
        add     r7, r5, r0
        addi    r12, r12, -1            ; the next block's home row
        bge     r12, r0, sm_row_ok
        add     r12, r12, r14
        addi    r12, r12, 1
sm_row_ok:
        addi    r9, r9, 1
        bge     r14, r9, sm_step
        ld      r8, SM_CI(r15)
        beq     r8, r0, op_done         ; no classes here: nothing to compute
; m = max over classes, then z = z - m, row by row
        ldsd    d0, SM_M(r15)
        ldsd    d1, SM_TMEM(r15)
        ld      r11, SM_ZALL(r15)
        setb    d1, r11
        fmov    d0, d1
        ld      r10, SM_C(r15)
        addi    r10, r10, -1
        beq     r10, r0, sm_max_done
sm_max:
        addb    d1, r3
        fmax    d0, d0, d1
        addi    r10, r10, -1
        bne     r10, r0, sm_max
sm_max_done:
        setb    d1, r11
        ld      r10, SM_C(r15)
sm_sub:
        fsub    d1, d1, d0
        addb    d1, r3
        addi    r10, r10, -1
        bne     r10, r0, sm_sub
; e = exp(z) over all N = C*T values (z <= 0)
        ldsd    d1, SM_ZN(r15)          ; z, then the polynomial p, then e
        ldsd    d2, SM_FN(r15)          ; t = z * log2e, then nf = float(n)
        ldsd    d3, SM_RN(r15)          ; r
        ld      r4, exp_log2e(r0)
        fmuls   d2, d1, r4
        ld      r10, SM_N(r15)
        ld      r11, SM_FB(r15)
        ld      r5, SM_NB(r15)
        ld      r6, exp_mhalf(r0)
sm_round:
        ld      r4, 0(r11)
        sfadd   r4, r4, r6              ; n = trunc(t - 0.5): t <= 0, so nearest
        ftoi    r4, r4
        st      r4, 0(r5)
        itof    r4, r4
        st      r4, 0(r11)
        addi    r11, r11, 1
        addi    r5, r5, 1
        addi    r10, r10, -1
        bne     r10, r0, sm_round
        ld      r4, exp_ln2hi(r0)
        fmacs   d3, d1, d2, r4          ; r = z + nf * -ln2hi
        ld      r4, exp_ln2lo(r0)
        fmacs   d3, d3, d2, r4          ; r = r + nf * -ln2lo
        ld      r4, exp_c6(r0)
        fmuls   d1, d3, r4              ; p = r * c6
        ld      r4, exp_c5(r0)
        fadds   d1, d1, r4
        fmul    d1, d1, d3
        ld      r4, exp_c4(r0)
        fadds   d1, d1, r4
        fmul    d1, d1, d3
        ld      r4, exp_c3(r0)
        fadds   d1, d1, r4
        fmul    d1, d1, d3
        ld      r4, exp_c2(r0)
        fadds   d1, d1, r4
        fmul    d1, d1, d3
        ld      r4, exp_c1(r0)
        fadds   d1, d1, r4
        fmul    d1, d1, d3
        ld      r4, exp_c0(r0)
        fadds   d1, d1, r4              ; p = exp(r)
        ld      r10, SM_N(r15)
        ld      r11, SM_ZALL(r15)
        ld      r5, SM_NB(r15)
sm_scale:
        ld      r4, 0(r5)               ; n
        ld      r6, 0(r11)              ; p
        shri    r7, r6, 23
        add     r7, r7, r4              ; the exponent field of p * 2^n
        slt     r7, r0, r7              ; 1 if it is a normal number, else 0 (flushed)
        shli    r4, r4, 23
        add     r6, r6, r4
        mul     r6, r6, r7
        st      r6, 0(r11)
        addi    r11, r11, 1
        addi    r5, r5, 1
        addi    r10, r10, -1
        bne     r10, r0, sm_scale
; S = sum over classes, in class order
        ldsd    d0, SM_S(r15)
        ldsd    d1, SM_TMEM(r15)
        ld      r11, SM_ZALL(r15)
        setb    d1, r11
        fmov    d0, d1
        ld      r10, SM_C(r15)
        addi    r10, r10, -1
        beq     r10, r0, sm_sum_done
sm_sum:
        addb    d1, r3
        fadd    d0, d0, d1
        addi    r10, r10, -1
        bne     r10, r0, sm_sum
sm_sum_done:
; inv = 1/S: y = magic - bits(S), two steps y = y (2 - S y), one y = y + y (1 - S y)
        ld      r11, SM_SB(r15)
        ld      r5, SM_IB(r15)
        ld      r6, rcp_magic(r0)
        add     r10, r3, r0
sm_seed:
        ld      r4, 0(r11)
        sub     r4, r6, r4
        st      r4, 0(r5)
        addi    r11, r11, 1
        addi    r5, r5, 1
        addi    r10, r10, -1
        bne     r10, r0, sm_seed
        ldsd    d1, SM_INV(r15)
        ldsd    d2, SM_TMP(r15)
        ldsd    d4, SM_TWO(r15)         ; 2.0 (stride 0)
        li      r10, 2
sm_newton:
        fmul    d2, d0, d1              ; q = S * y
        fsub    d2, d4, d2              ; q = 2 - q
        fmul    d1, d1, d2              ; y = y * q
        addi    r10, r10, -1
        bne     r10, r0, sm_newton
        li      r4, one
        setb    d4, r4                  ; 1.0 (stride 0)
        fmul    d2, d0, d1              ; q = S * y
        fsub    d2, d4, d2              ; q = 1 - q
        fmul    d2, d1, d2              ; q = y * q
        fadd    d1, d1, d2              ; y = y + q
; own classes: dz[u] = (e[c] * inv - onehot[u]) * scale, c = u*H + row
        ldsd    d0, SM_DZ(r15)
        ldsd    d2, SM_ONEHOT(r15)
        ldsd    d3, SM_SCALE(r15)
        ldsd    d5, SM_TMEM(r15)
        ld      r11, SM_ZALL(r15)
        ld      r12, SM_ROW(r15)
        mul     r12, r12, r3
        add     r11, r11, r12
        setb    d5, r11
        ld      r8, SM_HT(r15)
        ld      r10, SM_CI(r15)
sm_delta:
        fmul    d0, d5, d1
        fsub    d0, d0, d2
        fmul    d0, d0, d3
        addb    d0, r3
        addb    d2, r3
        addb    d5, r8
        addi    r10, r10, -1
        bne     r10, r0, sm_delta
        jmp     op_done

        .task T_RUN, run
