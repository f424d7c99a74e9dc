; pipe_sparse.s: the forward pass with activation sparsity harvesting (psfwd), part of
; pipe.s (included there; docs/layer_pipelined.md section 6a). The same conventions
; as pipe.s: r15 the record, its fields the PS_* offsets of firmware/training/pipe.py.

; ---------------------------------------------------------------------------
; psfwd: pfwd with activation sparsity harvesting (docs/layer_pipelined.md,
; section 6a). With `sin`, the sample's inputs arrive as (index, value)
; pairs, only the nonzero ones, in index order, ending with the index -1:
; the PE clears the sample's input slot and its partial sums to +0 (at a
; chain end with a bias: to b, as pfwd starts them there) and, per
; pair, stores the value at its index and adds its products,
;   P[o] = add(P[o], mul(Wt[k][o], x[k]))   (fmacs: two roundings)
; so the zeros cost neither wavelets nor multiply-adds. With `sout`, a chain
; end sends its outputs on the same way: a pair for every output whose word
; is not +0, then the end marker. Cycles depend on the activations here.
;   r1 the pair's address, r3 samples left, r4 K, r5 O, r8 input slot,
;   r9 output slot, r14 the tile's address
; With `sin` 2 the inputs arrive dense and pk_rec skips the zeros (below).
psfwd:
        ld      r10, PS_SIN(r15)
        li      r11, 2
        beq     r10, r11, pk_rec
        ld      r3, PS_T(r15)
        ld      r4, PS_K(r15)
        ld      r5, PS_O(r15)
        ld      r8, PS_XBASE(r15)
        ld      r9, PS_YBASE(r15)
ps_sample:
        ld      r10, PS_SIN(r15)
        bne     r10, r0, ps_sparse
        ldsd    d0, PS_XIN(r15)         ; dense inputs, as pfwd
        ldsd    d1, PS_XS(r15)
        setb    d1, r8
        fmov    d1, d0
        ld      r7, 0(r8)
        ldsd    d2, PS_ACC(r15)
        ldsd    d3, PS_W0(r15)
        ld      r10, PS_BIAS(r15)
        bne     r10, r0, ps_dbias
        fmuls   d2, d3, r7
        jmp     ps_dmac
ps_dbias:
        ldsd    d6, PS_B(r15)
        fmacs   d2, d6, d3, r7          ; a chain end with a bias: P = b + Wt[0] * x[0]
ps_dmac:
        ldsd    d4, PS_W1(r15)
        ldsd    d5, PS_XW(r15)
        addi    r10, r8, 1
        setb    d5, r10
        fmacw   d2, d4, d5
        jmp     ps_chain
ps_sparse:
        ldsd    d1, PS_XS(r15)
        setb    d1, r8
        ldsd    d0, PS_ZK(r15)
        fmov    d1, d0                  ; the input slot = +0
        ldsd    d2, PS_ACC(r15)
        ldsd    d0, PS_ZO(r15)
        ld      r10, PS_BIAS(r15)
        beq     r10, r0, ps_szero
        ldsd    d0, PS_B(r15)
        ld      r11, f_one(r0)
        fmuls   d2, d0, r11             ; a chain end with a bias: P = mul(b, 1) (b flushed)
        jmp     ps_sset
ps_szero:
        fmov    d2, d0                  ; P = +0
ps_sset:
        ldsd    d0, PS_PAIR(r15)
        ldsd    d6, PS_PIN(r15)
        ldsd    d3, PS_W0(r15)
        ld      r14, PS_WBASE(r15)
        ld      r1, PS_PBASE(r15)
ps_take:
        fmov    d0, d6                  ; a pair from the fabric
        ld      r7, 0(r1)
        blt     r7, r0, ps_chain        ; the end marker
        ld      r11, 1(r1)
        add     r12, r8, r7
        st      r11, 0(r12)             ; x[k] into the input slot
        mul     r13, r7, r5
        add     r13, r13, r14
        setb    d3, r13
        fmacs   d2, d2, d3, r11         ; P += Wt[k] * x[k]
        jmp     ps_take
ps_chain:
        ld      r6, PS_FIRST(r15)
        ldsd    d6, PS_CIN(r15)
        ld      r10, PS_LAST(r15)
        bne     r10, r0, ps_last
        ldsd    d7, PS_COUT(r15)
        beq     r6, r0, ps_pass
        fmov    d7, d2                  ; first of the chain: send P
        jmp     ps_next
ps_pass:
        fadd    d7, d6, d2              ; send in + P
        jmp     ps_next
ps_last:
        ldsd    d7, PS_YS(r15)
        setb    d7, r9
        beq     r6, r0, ps_lpass
        fmov    d7, d2                  ; a chain of one PE: y = P
        jmp     ps_relu
ps_lpass:
        fadd    d7, d6, d2              ; y = in + P
ps_relu:
        ld      r10, PS_RELU(r15)
        beq     r10, r0, ps_send
        ld      r11, PS_SEND(r15)
        beq     r11, r0, ps_rkeep       ; the last layer: keep max(y, +0)
        ld      r11, PS_SOUT(r15)
        beq     r11, r0, ps_rsend       ; sent dense: the ReLU on the way out, ys keeps y
ps_rkeep:
        fmaxs   d7, d7, r0              ; y = max(y, +0) (pairs are sent from it)
ps_send:
        ld      r10, PS_SEND(r15)
        beq     r10, r0, ps_stored
        ld      r10, PS_SOUT(r15)
        bne     r10, r0, ps_harvest
        ldsd    d6, PS_XOUT(r15)
        fmov    d6, d7                  ; on to the next region, dense
        jmp     ps_stored
ps_rsend:
        ldsd    d6, PS_XOUT(r15)
        fmaxs   d6, d7, r0              ; max(y, +0) on to the next region, dense
        jmp     ps_stored
ps_harvest:
        ldsd    d0, PS_PAIR(r15)
        ldsd    d6, PS_POUT(r15)
        ld      r1, PS_PBASE(r15)
        add     r12, r9, r0
        add     r13, r0, r0
ps_hloop:
        ld      r11, 0(r12)
        beq     r11, r0, ps_hskip       ; +0: not sent
        st      r13, 0(r1)
        st      r11, 1(r1)
        fmov    d6, d0                  ; (index, value)
ps_hskip:
        addi    r12, r12, 1
        addi    r13, r13, 1
        bne     r13, r5, ps_hloop
        li      r11, -1
        st      r11, 0(r1)
        fmov    d6, d0                  ; the end marker
ps_stored:
        add     r9, r9, r5
ps_next:
        add     r8, r8, r4
        addi    r3, r3, -1
        bne     r3, r0, ps_sample
        jmp     op_done

; ---------------------------------------------------------------------------
; pk_rec: psfwd with `sin` 2, receiver-side skipping. The inputs arrive dense
; (the chain ends before send as pfwd does) and the PE takes them one `recv`
; at a time into the sample's input slot (kept dense for the backward pass);
; two inputs a round, a zero costs four instructions, a nonzero input its multiply-adds,
;   P = add(s, mul(Wt[k], x[k])) for the first nonzero input k, s = b at a chain
;   end with a bias (fmacs reads b flushed, as mul(b, 1) gives it), else +0;
;   P = add(P, mul(Wt[k], x[k])) for the later ones, in index order;
;   P = mul(s, 1) when every input is +0,
; the float order of section 6a, with no O-element start of P a sample. The
; chain and the send as pfwd's (sent dense: `sout` is not used with `sin` 2).
; The flags and descriptors stay in registers for the whole record.
;   r1 first, r2 scratch, r3 samples left, r4 K, r5 O, r6 last, r7 a nonzero
;   input seen, r8 input slot, r9 output slot, r10 the inputs' color, r11 x[k],
;   r12 the input's word, r13 the slot's last word, r14 the tile's address
;   d0 the next region's inputs, d2 P, d3 Wt[k], d5 s, d6 chain in, d7 chain
;   out (inside a chain) or the output slot (at its end)
pk_rec:
        ld      r3, PS_T(r15)
        ld      r4, PS_K(r15)
        ld      r5, PS_O(r15)
        ld      r8, PS_XBASE(r15)
        ld      r9, PS_YBASE(r15)
        ld      r14, PS_WBASE(r15)
        ld      r1, PS_FIRST(r15)
        ld      r6, PS_LAST(r15)
        ld      r10, PS_XIN(r15)
        andi    r10, r10, 0xffff        ; the input multicast's color (0 or 1, section 2)
        ldsd    d2, PS_ACC(r15)
        ldsd    d3, PS_W0(r15)
        ldsd    d5, PS_ZO(r15)          ; s = +0
        ld      r11, PS_BIAS(r15)
        beq     r11, r0, pk_regs
        ldsd    d5, PS_B(r15)           ; a chain end with a bias: s = b
pk_regs:
        ldsd    d6, PS_CIN(r15)
        ldsd    d7, PS_COUT(r15)
        beq     r6, r0, pk_sample
        ldsd    d7, PS_YS(r15)
        ldsd    d0, PS_XOUT(r15)
pk_sample:
        add     r12, r8, r0             ; the sample's input slot
        add     r13, r12, r4
        addi    r13, r13, -1            ; its last word
        add     r7, r0, r0              ; no nonzero input yet
        bne     r10, r0, pk_t1
pk_t0:
        bge     r12, r13, pk_l0       ; fewer than two inputs left
pk_k0:                                  ; two inputs a round
        recv    r11, 0                  ; x[k]
        st      r11, 0(r12)             ; into the input slot
        bne     r11, r0, pk_n0          ; not +0: its multiply-adds
pk_b0:
        recv    r11, 0                  ; x[k+1]
        st      r11, 1(r12)
        bne     r11, r0, pk_m0
pk_z0:
        addi    r12, r12, 2
        blt     r12, r13, pk_k0
pk_l0:
        bne     r12, r13, pk_sums       ; an even number of inputs: done
        recv    r11, 0                  ; the last of an odd number
        st      r11, 0(r12)
        beq     r11, r0, pk_sums
        sub     r2, r12, r8
        jmp     pk_a0
pk_n0:
        sub     r2, r12, r8             ; k
        mul     r2, r2, r5
        add     r2, r2, r14
        setb    d3, r2                  ; Wt[k]
        beq     r7, r0, pk_f0
        fmacs   d2, d2, d3, r11         ; P += Wt[k] * x[k]
        jmp     pk_b0
pk_f0:
        fmacs   d2, d5, d3, r11         ; the first nonzero input: P = s + Wt[k] * x[k]
        addi    r7, r0, 1
        jmp     pk_b0
pk_m0:
        sub     r2, r12, r8
        addi    r2, r2, 1               ; k + 1
        mul     r2, r2, r5
        add     r2, r2, r14
        setb    d3, r2
        beq     r7, r0, pk_g0
        fmacs   d2, d2, d3, r11
        jmp     pk_z0
pk_g0:
        fmacs   d2, d5, d3, r11
        addi    r7, r0, 1
        jmp     pk_z0
pk_a0:                                  ; the odd last input, not +0
        mul     r2, r2, r5
        add     r2, r2, r14
        setb    d3, r2
        beq     r7, r0, pk_h0
        fmacs   d2, d2, d3, r11
        jmp     pk_sums
pk_h0:
        fmacs   d2, d5, d3, r11
        addi    r7, r0, 1
        jmp     pk_sums
pk_t1:
        bge     r12, r13, pk_l1       ; fewer than two inputs left
pk_k1:                                  ; two inputs a round
        recv    r11, 1                  ; x[k]
        st      r11, 0(r12)             ; into the input slot
        bne     r11, r0, pk_n1          ; not +0: its multiply-adds
pk_b1:
        recv    r11, 1                  ; x[k+1]
        st      r11, 1(r12)
        bne     r11, r0, pk_m1
pk_z1:
        addi    r12, r12, 2
        blt     r12, r13, pk_k1
pk_l1:
        bne     r12, r13, pk_sums       ; an even number of inputs: done
        recv    r11, 1                  ; the last of an odd number
        st      r11, 0(r12)
        beq     r11, r0, pk_sums
        sub     r2, r12, r8
        jmp     pk_a1
pk_n1:
        sub     r2, r12, r8             ; k
        mul     r2, r2, r5
        add     r2, r2, r14
        setb    d3, r2                  ; Wt[k]
        beq     r7, r0, pk_f1
        fmacs   d2, d2, d3, r11         ; P += Wt[k] * x[k]
        jmp     pk_b1
pk_f1:
        fmacs   d2, d5, d3, r11         ; the first nonzero input: P = s + Wt[k] * x[k]
        addi    r7, r0, 1
        jmp     pk_b1
pk_m1:
        sub     r2, r12, r8
        addi    r2, r2, 1               ; k + 1
        mul     r2, r2, r5
        add     r2, r2, r14
        setb    d3, r2
        beq     r7, r0, pk_g1
        fmacs   d2, d2, d3, r11
        jmp     pk_z1
pk_g1:
        fmacs   d2, d5, d3, r11
        addi    r7, r0, 1
        jmp     pk_z1
pk_a1:                                  ; the odd last input, not +0
        mul     r2, r2, r5
        add     r2, r2, r14
        setb    d3, r2
        beq     r7, r0, pk_h1
        fmacs   d2, d2, d3, r11
        jmp     pk_sums
pk_h1:
        fmacs   d2, d5, d3, r11
        addi    r7, r0, 1
pk_sums:
        bne     r7, r0, pk_chain
        ld      r11, f_one(r0)
        fmuls   d2, d5, r11             ; every input +0: P = mul(s, 1)
pk_chain:
        bne     r6, r0, pk_end
        bne     r1, r0, pk_head
        fadd    d7, d6, d2              ; send in + P
        jmp     pk_next
pk_head:
        fmov    d7, d2                  ; the chain's first PE: send P
        jmp     pk_next
pk_end:
        setb    d7, r9                  ; the sample's output slot
        bne     r1, r0, pk_one
        fadd    d7, d6, d2              ; y = in + P
        jmp     pk_out
pk_one:
        fmov    d7, d2                  ; a chain of one PE: y = P
pk_out:
        ld      r11, PS_SEND(r15)
        ld      r2, PS_RELU(r15)
        beq     r11, r0, pk_keep
        beq     r2, r0, pk_plain
        fmaxs   d0, d7, r0              ; max(y, +0) on to the next region (ys keeps y)
        jmp     pk_stored
pk_plain:
        fmov    d0, d7                  ; y on to the next region
        jmp     pk_stored
pk_keep:
        beq     r2, r0, pk_stored
        fmaxs   d7, d7, r0              ; the last layer's ReLU: keep max(y, +0)
pk_stored:
        add     r9, r9, r5
pk_next:
        add     r8, r8, r4
        addi    r3, r3, -1
        bne     r3, r0, pk_sample
        jmp     op_done
