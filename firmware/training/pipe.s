; pipe.s: the PE program of layer-pipelined training (docs/layer_pipelined.md).
;
; Every layer owns a rectangle of PEs (its region); each PE of a region keeps
; a tile of the layer's weights in its memory for the whole run. One program
; on every PE. A phase is one run: the host writes the address of the phase's
; op list into `phase_ops` and launches T_RUN; the task walks the records of
; the list (layout in firmware/training/pipe_records.py, which defines the
; K_* kind codes and the XX_FIELD offsets used below) and exits at the `end`
; record. r15 points at the current record throughout.
;
; Timing never depends on data: every branch tests a record field or a loop
; counter, so the static cycle model can follow the control flow.

        .equ T_RUN, 0           ; the one task: run the phase's op list

        .data
phase_ops: .word 0              ; op list of the phase to run (written by the host)
f_zero:   .word 0               ; +0.0

        .text
run:
        ld      r15, phase_ops(r0)
next_op:
        ld      r1, R_KIND(r15)
        beq     r1, r0, run_done
        li      r2, K_PFWD
        beq     r1, r2, pfwd
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
; pfwd: one layer's forward pass on this PE, for every sample of the batch.
; The PE holds the tile Wt[k][o] (k-major: the O weights of input k are
; contiguous) of its K inputs and O outputs. Per sample it takes its K input
; values from the region's input multicast into the sample's slot of the
; input store, forms the partial sums
;   P[o] = mul(Wt[0][o], x[0]);  P[o] = add(P[o], mul(Wt[k][o], x[k])), k = 1 .. K-1
; and passes them along the region's reduction chain: the first PE sends P,
; the others send add(in, P). The last PE of the chain keeps add(in, P) in
; the sample's slot of the output store, adds the bias, applies the ReLU and
; sends the result on to the next layer's region (all by record flags).
;   r3 samples left, r4 K, r5 O, r8 input slot, r9 output slot
pfwd:
        ld      r3, PF_T(r15)
        ld      r4, PF_K(r15)
        ld      r5, PF_O(r15)
        ld      r8, PF_XBASE(r15)
        ld      r9, PF_YBASE(r15)
pf_sample:
        ldsd    d0, PF_XIN(r15)         ; the sample's K inputs from the fabric
        ldsd    d1, PF_XS(r15)
        setb    d1, r8
        fmov    d1, d0                  ; ... into the input store
        ld      r7, 0(r8)
        ldsd    d2, PF_ACC(r15)
        ldsd    d3, PF_W0(r15)
        fmuls   d2, d3, r7              ; P = Wt[0] * x[0]
        ldsd    d4, PF_W1(r15)
        ldsd    d5, PF_XW(r15)
        addi    r10, r8, 1
        setb    d5, r10
        fmacw   d2, d4, d5              ; P += Wt[k] * x[k], k = 1 .. K-1
        ld      r6, PF_FIRST(r15)
        ldsd    d6, PF_CIN(r15)
        ld      r10, PF_LAST(r15)
        bne     r10, r0, pf_last
        ldsd    d7, PF_COUT(r15)
        beq     r6, r0, pf_pass
        fmov    d7, d2                  ; first of the chain: send P
        jmp     pf_next
pf_pass:
        fadd    d7, d6, d2              ; send in + P
        jmp     pf_next
pf_last:
        ldsd    d7, PF_YS(r15)
        setb    d7, r9
        beq     r6, r0, pf_lpass
        fmov    d7, d2                  ; a chain of one PE: y = P
        jmp     pf_bias
pf_lpass:
        fadd    d7, d6, d2              ; y = in + P
pf_bias:
        ld      r10, PF_BIAS(r15)
        beq     r10, r0, pf_relu
        ldsd    d6, PF_B(r15)
        fadd    d7, d7, d6              ; y = y + b
pf_relu:
        ld      r10, PF_RELU(r15)
        beq     r10, r0, pf_send
        fmaxs   d7, d7, r0              ; y = max(y, +0)
pf_send:
        ld      r10, PF_SEND(r15)
        beq     r10, r0, pf_stored
        ldsd    d6, PF_XOUT(r15)
        fmov    d6, d7                  ; on to the next layer's region
pf_stored:
        add     r9, r9, r5
pf_next:
        add     r8, r8, r4
        addi    r3, r3, -1
        bne     r3, r0, pf_sample
        jmp     op_done

        .task T_RUN, run
