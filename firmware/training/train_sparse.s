; The sparse records of the weight-streaming training program (train.s
; includes this file): docs/weight_streaming.md section 13.

; ---------------------------------------------------------------------------
; spgemm: the sparse streamed GEMM of a masked layer (docs/weight_streaming.md
; section 13): sgemm's steps and ring, but the row's stream holds only the
; non-zeros of each output, as index/value pairs (the index is the address of
; the feature's token block here), and the steps run in blocks: first the
; partial of every step of a block with a non-zero on this row, each into the
; next slot of T words (so that a row with more non-zeros in one step catches
; up in the next instead of holding up the ring), then the block's ring
; operations, one per step in order.
; Compute part, per step with a non-zero here: the pairs, then a carriage
; return (a control wavelet: the first pair starts the slot from the zero
; block, fmacx takes the others and the carriage return); a step without one
; sends nothing; -3 ends the part.
; Ring part, per step: -1 FIRST (a bias word follows: send add(acc, b)), -2
; MID (send add(in, acc)), -3 LAST (store add(in, acc) in the next y slot),
; -4 ONLY (one row: a bias word follows, store add(acc, b)), each on the next
; slot; for a step without a non-zero here the same on the zero block and no
; slot: 0 MID, 1 FIRST, 2 LAST, 3 ONLY; then -5 (the next block) or -6 (the
; end of the stream). No weight that is not there is multiplied. The trailing
; table (steps) and the field b (slots per block) describe the stream for the
; cycle model; this code does not read them.
;   r3 T, r4 1, r5 2, r9 -5, r10 -4, r11 -1, r12 -2, r13 -3, r14 the first slot
spgemm:
        ld      r3, SP_T(r15)
        ld      r14, SP_ACC(r15)        ; the first slot (setb takes the low 16 bits)
        ldsd    d0, SP_ACC(r15)
        ldsd    d1, SP_X(r15)
        ldsd    d2, SP_INP(r15)
        ldsd    d3, SP_OUT(r15)
        ldsd    d4, SP_W(r15)
        ldsd    d5, SP_ZERO(r15)
        ldsd    d6, SP_Y(r15)
        li      r4, 1
        li      r5, 2
        li      r9, -5
        li      r10, -4
        li      r11, -1
        li      r12, -2
        li      r13, -3
        jmp     spc_step
spc_done:
        addb    d0, r3                  ; the next slot
spc_step:
        recv    r1, C_W                 ; the step's first index, or -3
        blt     r1, r0, spr_start
        setb    d1, r1
        recv    r8, C_W
        fmacs   d0, d5, d1, r8          ; acc = +0 + x[k] * w
        fmacx   d0, d1, d4, C_W, r0     ; acc += x[k] * w for every other pair, until the carriage return
        jmp     spc_done
spr_start:
        setb    d0, r14
        jmp     spr_step
spr_mid:
        fadd    d3, d2, d0              ; send add(in, acc)
        addb    d0, r3
spr_step:
        recv    r1, C_W                 ; the ring kind
        beq     r1, r12, spr_mid
        bge     r1, r0, spz_step
        beq     r1, r11, spr_first
        beq     r1, r13, spr_last
        blt     r1, r10, spr_end
        recv    r8, C_W                 ; ONLY
        fadds   d6, d0, r8
        addb    d6, r3
        addb    d0, r3
        jmp     spr_step
spr_first:
        recv    r8, C_W
        fadds   d3, d0, r8              ; send add(acc, b)
        addb    d0, r3
        jmp     spr_step
spr_last:
        fadd    d6, d2, d0              ; store add(in, acc)
        addb    d6, r3
        addb    d0, r3
        jmp     spr_step
spr_end:
        setb    d0, r14
        beq     r1, r9, spc_step        ; -5: the next block
        jmp     op_done                 ; -6: the end of the stream
spz_step:                               ; a step without a non-zero here: the zero block, no slot
        bne     r1, r0, spz_other
        fadd    d3, d2, d5              ; 0 MID: send add(in, +0)
        jmp     spr_step
spz_other:
        beq     r1, r4, spz_first
        beq     r1, r5, spz_last
        recv    r8, C_W                 ; 3 ONLY
        fadds   d6, d5, r8
        addb    d6, r3
        jmp     spr_step
spz_first:
        recv    r8, C_W
        fadds   d3, d5, r8              ; 1 FIRST: send add(+0, b)
        jmp     spr_step
spz_last:
        fadd    d6, d2, d5              ; 2 LAST: store add(in, +0)
        addb    d6, r3
        jmp     spr_step

; ---------------------------------------------------------------------------
; spwgrad: the weight (and bias) gradients of a masked layer: wgrad's rotation
; of the deltas and its row chain, but only the kept weights' gradients are
; computed and leave the mesh. MemoryX sends the mask as indices on C_W
; (multicast along the row): per output o of the held block, a marker (a
; control wavelet), then the address of x[k] (feature-major, T words) of
; every kept weight W[o, k] of this row; fdotx puts each into the next word
; of G (G starts at +0):
;   G[m] += x[k][t] * dy[o][t], t = 0 .. T-1    (a one-word accumulator)
; (wgrad's order for that weight: +0 + x[k][0]*dy[o][0] + ...) and stops at
; the next marker: -1 (the next output's indices follow), -5 (step 0 with a
; bias: the next word of G is the bias partial, then the output's indices),
; -6 and a count N (the row chain of G's first N words, east = west + G, and
; those words back to +0; MemoryX sends it when the next output would not
; fit, and at the end; another marker follows), -7 (the end of the rotation
; step).
;   r3 T, r4 1, r5 current block (moving pointer), r6 receive buffer, r7 other
;   buffer, r9 s, r10 -4, r11 -1, r12 -2 (after the rotation), r13 &G, r14 H-1
spwgrad:
        ld      r3, SW_T(r15)
        ld      r13, SW_GA(r15)
        ld      r5, SW_OWN(r15)
        ld      r6, SW_BUF0(r15)
        ld      r7, SW_BUF1(r15)
        ld      r14, SW_H(r15)
        addi    r14, r14, -1
        ldsd    d0, SW_GALL(r15)
        ldsd    d1, SW_ZERO(r15)
        fmov    d0, d1                  ; G = +0
        ldsd    d0, SW_G(r15)           ; G[m], one word (moving)
        ldsd    d3, SW_X(r15)           ; x[k], T words
        li      r4, 1
        li      r9, 0
swg_step:
        add     r10, r15, r9
        ld      r10, SW_COUNTS(r10)
        bge     r9, r14, swg_compute    ; the last step passes nothing on
        mul     r11, r10, r3            ; words of this block
        add     r12, r15, r9
        ld      r12, SW_COUNTS+1(r12)
        mul     r12, r12, r3            ; words of the next block
        ldsd    d4, SW_ROUT(r15)
        setl    d4, r11
        ldsd    d5, SW_MEM(r15)
        setb    d5, r5
        ldsd    d6, SW_RIN(r15)
        ldsd    d7, SW_MEM(r15)
        setb    d7, r6
        setl    d7, r12
        ld      r8, SW_SEND_FIRST(r15)
        beq     r8, r0, swg_recv_first
        fmov    d4, d5                  ; send this block on
        fmov    d7, d6                  ; take the next one
        jmp     swg_compute
swg_recv_first:
        fmov    d7, d6
        fmov    d4, d5
swg_compute:
        ldsd    d7, SW_DYO(r15)
        setb    d7, r5                  ; dy[o][0 ..] of the block's first output
        li      r10, -4
        li      r11, -1
        li      r12, -2
        recv    r1, C_W                 ; the step's first marker
swg_mark:
        blt     r1, r10, swg_other      ; -5, -6 or -7
swg_out:                                ; -1: an output's indices follow
        fdotx   d0, d3, d7, C_W, r1     ; G[m] += x[k][t] * dy[o][t], m += 1, until the next marker
        addb    d7, r3                  ; the next output's deltas
        beq     r1, r11, swg_out
swg_other:
        addi    r1, r1, 4
        bne     r1, r11, swg_chain
        li      r8, 0                   ; -5: the bias partial 0 + dy[o][0] + ...
        fsum    r8, d7
        fadds   d0, d1, r8              ; G[m] = +0 + r8 (r8, summed from +0, is never -0)
        addb    d0, r4
        jmp     swg_out
swg_chain:
        bne     r1, r12, swg_next       ; -7: the end of the rotation step
        recv    r8, C_W                 ; -6: N
        ldsd    d5, SW_EOUT(r15)
        ldsd    d6, SW_EIN(r15)
        ldsd    d2, SW_GALL(r15)
        setl    d5, r8
        setl    d6, r8
        setl    d2, r8
        fadd    d5, d6, d2              ; east = west + G
        fmov    d2, d1                  ; G back to +0
        setb    d0, r13
        recv    r1, C_W                 ; the next marker
        jmp     swg_mark
swg_next:
        add     r5, r6, r0              ; the received block is the next one
        add     r6, r7, r0
        add     r7, r5, r0
        addi    r9, r9, 1
        bge     r14, r9, swg_step
        jmp     op_done
