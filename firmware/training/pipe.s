; pipe.s: the PE program of layer-pipelined training (docs/layer_pipelined.md).
;
; Every layer owns a rectangle of PEs (its region); each PE of a region keeps
; a tile of the layer's weights in its memory for the whole run. One program
; on every PE. A phase is one run: the host writes the address of the phase's
; op list into `phase_ops` and launches T_RUN; the task walks the records of
; the list (layout in firmware/training/pipe.py, which defines the
; K_* kind codes and the XX_FIELD offsets used below) and exits at the `end`
; record. r15 points at the current record throughout.
;
; Timing never depends on data: every branch tests a record field or a loop
; counter, so the static cycle model can follow the control flow.

        .equ T_RUN, 0           ; the one task: run the phase's op list

        .data
phase_ops: .word 0              ; op list of the phase to run (written by the host)
f_zero:   .word 0               ; +0.0: a stride-0 memory descriptor on it is a zero vector
f_big:    .word 0xff000000      ; -2^127 (the ReLU mask)
f_mone:   .word 0xbf800000      ; -1.0
f_one:    .word 0x3f800000      ; 1.0

        .text
run:
        ld      r15, phase_ops(r0)
next_op:
        ld      r1, R_KIND(r15)
        beq     r1, r0, run_done
        li      r2, K_PFWD
        beq     r1, r2, pfwd
        li      r2, K_PBWD
        beq     r1, r2, pbwd
        li      r2, K_PUPD
        beq     r1, r2, pupd
        li      r2, K_PSFWD
        beq     r1, r2, psfwd
        li      r2, K_PVOP
        beq     r1, r2, pvop
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
; (at a chain end with a bias P[o] = add(b[o], mul(Wt[0][o], x[0])) first)
; and passes them along the region's reduction chain: the first PE sends P,
; the others send add(in, P). The last PE of the chain forms P in the sample's
; slot of the output store and y = add(in, P) there, then sends max(y, +0)
; on to the next layer's region (the ReLU applied on the way out: the output
; store keeps y) or, at the last layer, keeps max(y, +0) (all by record flags).
; The descriptors stay in registers for the whole record and each role has a
; loop of its own, so a sample costs its vector instructions and a few cycles;
; a PE takes the next sample's inputs before its chain operation waits on the
; PE before it, so the chain's latency does not hold up the input multicasts.
;   r1 1, r3 samples left, r4 K, r5 O, r8 input slot, r13 K - 1
;   d0 inputs (fabric), d1 input slot (x[0..], then x[1..]), d3 Wt[0], d4 Wt[1..],
;   d6 chain in; inside a chain d2 P, d7 chain out; at its end d2 the output slot,
;   d5 the bias, d7 the next region's inputs
pfwd:
        ld      r3, PF_T(r15)
        ld      r4, PF_K(r15)
        ld      r5, PF_O(r15)
        ld      r8, PF_XBASE(r15)
        li      r1, 1
        addi    r13, r4, -1
        ldsd    d0, PF_XIN(r15)
        ldsd    d1, PF_XS(r15)
        setb    d1, r8
        fmov    d1, d0                  ; the first sample's K inputs into its slot
        ldsd    d3, PF_W0(r15)
        ldsd    d4, PF_W1(r15)
        ldsd    d6, PF_CIN(r15)
        ld      r10, PF_LAST(r15)
        bne     r10, r0, pf_end
        ldsd    d2, PF_ACC(r15)
        ldsd    d7, PF_COUT(r15)
        ld      r10, PF_FIRST(r15)
        bne     r10, r0, pf_head
pf_mid:                                 ; inside a chain: send in + P
        ld      r7, 0(r8)
        addb    d1, r1
        fmuls   d2, d3, r7              ; P = Wt[0] * x[0]
        fmacw   d2, d4, d1              ; P += Wt[k] * x[k], k = 1 .. K-1
        addb    d1, r13                 ; the next sample's slot
        add     r8, r8, r4
        addi    r3, r3, -1
        beq     r3, r0, pf_mlast
        fmov    d1, d0                  ; the next sample's inputs, before the chain waits
        fadd    d7, d6, d2              ; send in + P
        jmp     pf_mid
pf_mlast:
        fadd    d7, d6, d2
        jmp     op_done
pf_head:                                ; the first PE of a chain: send P
        ld      r7, 0(r8)
        addb    d1, r1
        fmuls   d2, d3, r7
        fmacw   d2, d4, d1
        addb    d1, r13
        add     r8, r8, r4
        addi    r3, r3, -1
        beq     r3, r0, pf_hlast
        fmov    d1, d0
        fmov    d7, d2                  ; send P
        jmp     pf_head
pf_hlast:
        fmov    d7, d2
        jmp     op_done
pf_end:                                 ; the chain's end: y in the output store
        ld      r9, PF_YBASE(r15)
        ldsd    d2, PF_YS(r15)
        setb    d2, r9
        ldsd    d5, PF_B(r15)
        ldsd    d7, PF_XOUT(r15)
        ld      r11, PF_BIAS(r15)
        ld      r12, PF_FIRST(r15)
        ld      r14, PF_RELU(r15)
        ld      r10, PF_SEND(r15)
        add     r14, r14, r14
        add     r14, r14, r10           ; 2 relu + send
        li      r2, 3
pf_eloop:
        ld      r7, 0(r8)
        addb    d1, r1
        bne     r11, r0, pf_ebias
        fmuls   d2, d3, r7              ; P = Wt[0] * x[0]
        jmp     pf_emac
pf_ebias:
        fmacs   d2, d5, d3, r7          ; P = b + Wt[0] * x[0]
pf_emac:
        fmacw   d2, d4, d1              ; P += Wt[k] * x[k], k = 1 .. K-1
        addb    d1, r13
        add     r8, r8, r4
        addi    r3, r3, -1
        beq     r3, r0, pf_echain
        fmov    d1, d0                  ; the next sample's inputs, before the chain waits
pf_echain:
        bne     r12, r0, pf_eout        ; a chain of one PE: y = P
        fadd    d2, d6, d2              ; y = in + P
pf_eout:
        beq     r14, r0, pf_enext       ; the last layer: keep y
        bne     r14, r2, pf_eone
        fmaxs   d7, d2, r0              ; send max(y, +0) on to the next region
        jmp     pf_enext
pf_eone:
        bne     r14, r1, pf_erelu
        fmov    d7, d2                  ; send y on (no ReLU)
        jmp     pf_enext
pf_erelu:
        fmaxs   d2, d2, r0              ; the last layer's ReLU: keep max(y, +0)
pf_enext:
        addb    d2, r5                  ; the next sample's output slot
        bne     r3, r0, pf_eloop
        jmp     op_done

; ---------------------------------------------------------------------------
; pbwd: one layer's backward pass on this PE, for every sample of the batch,
; in the order the forward pass left them. The chain end (the last PE of an
; output line) takes the sample's delta dy: written by the host into the
; output store at the last layer, else from the next region's input-gradient
; chain, multiplied by the ReLU mask of the output it kept,
;   mk = max(mul(max(ys, +0), -2^127), -1);  dz = mul(mul(dy, mk), -1)
; (dy where y > 0, a zero where y <= 0: the store keeps y, before the ReLU); adds dz into the bias gradient
;   db = add(db, dz)
; and multicasts dz back along the output line; the other PEs take it from
; there. Every PE with an input gradient to send (not layer 0) forms its
; partials of the layer's input gradient with its k-major tile,
;   D[k] = +0;  D[k] = add(D[k], mul(Wt[k][o], dz[o])), o = 0 .. O-1
; and passes them along its input line towards the previous region: the PE
; at the far end sends D, the others add(in, D), the last hop lands at the
; previous region's chain end. With `xmask` the line's near end applies the
; previous layer's ReLU mask to what it sends, from its own inputs x (that
; layer's ReLU outputs): mul(mul(t, max(mul(x, -2^127), -1)), -1), the same
; bits the chain end would form (which then takes dy as dz, `mask` clear). Then every PE accumulates its weight gradient
;   G[k][o] = add(G[k][o], mul(dz[o], x[k]))
; G and db start at +0 with the first pass of a batch (record flag `zero`)
; and accumulate over its later passes.
; The flags and the descriptors stay in registers for the whole record, and
; the chain ends and the other PEs each have an entry of their own into the
; per-sample loop, so a sample costs its vector instructions and about 15
; cycles of control (the input gradient's dots 5.5 more an input).
;   r1 bias, r2 mcast, r3 samples left, r4 K, r5 O, r6 input gradient (0 none,
;   -1 the far end: send D, 1 send in + D), r8 input slot, r9 output slot,
;   r11 xmask, r14 the chain end's delta (0 not an end, 1 the host's, 2 from
;   the fabric, 3 from the fabric through the ReLU mask)
;   d0 dz, d1 dz or dy from the fabric, d2 the dots' weights (and scratch),
;   d3 D, d4 D on, d5 the chain's D in, d6 G, d7 the sample's inputs
pbwd:
        ld      r3, PB_T(r15)
        ld      r4, PB_K(r15)
        ld      r5, PB_O(r15)
        ld      r8, PB_XBASE(r15)
        ld      r9, PB_YBASE(r15)
        ld      r10, PB_ZERO(r15)
        beq     r10, r0, pb_setup       ; a later pass of the batch: accumulate on
        ldsd    d0, PB_G(r15)
        ldsd    d1, PB_ZG(r15)
        fmov    d0, d1                  ; G = +0
        ld      r10, PB_BIAS(r15)
        beq     r10, r0, pb_setup
        ldsd    d0, PB_DB(r15)
        ldsd    d1, PB_ZO(r15)
        fmov    d0, d1                  ; db = +0
pb_setup:
        ld      r1, PB_BIAS(r15)
        ld      r2, PB_MCAST(r15)
        ld      r11, PB_XMASK(r15)
        ld      r6, PB_DX(r15)
        beq     r6, r0, pb_regs
        ld      r10, PB_DXFIRST(r15)
        beq     r10, r0, pb_regs
        li      r6, -1                  ; the far end of the input line
pb_regs:
        ldsd    d0, PB_DZ(r15)
        ldsd    d3, PB_DXV(r15)
        ldsd    d4, PB_BOUT(r15)
        ldsd    d5, PB_BIN(r15)
        ldsd    d6, PB_G(r15)
        ldsd    d7, PB_XG(r15)
        ld      r14, PB_END(r15)
        beq     r14, r0, pb_inner
        ld      r10, PB_HOST(r15)
        li      r14, 1
        bne     r10, r0, pb_eset
        ld      r10, PB_MASK(r15)
        li      r14, 2
        beq     r10, r0, pb_eset
        li      r14, 3
pb_eset:
        ldsd    d1, PB_DYIN(r15)
        jmp     pb_end
pb_inner:
        ldsd    d1, PB_DZIN(r15)
pb_in:                                  ; not a chain end: dz from the output line's multicast
        fmov    d0, d1
pb_dx:
        setb    d7, r8                  ; the sample's inputs
        beq     r6, r0, pb_wg
        ldsd    d2, PB_WROW(r15)
        ld      r12, PB_DXBASE(r15)
        add     r13, r4, r0
        andi    r10, r13, 1
        beq     r10, r0, pb_dot2        ; an even number of inputs: pairs only
        add     r7, r0, r0
        dot     r7, d2, d0              ; D[0] = +0 + Wt[0][0] * dz[0] + ...
        st      r7, 0(r12)
        addb    d2, r5                  ; the next input's weights
        addi    r12, r12, 1
        addi    r13, r13, -1
        beq     r13, r0, pb_dotted
pb_dot2:                                ; two inputs a round
        add     r7, r0, r0
        dot     r7, d2, d0              ; D[k] = +0 + Wt[k][0] * dz[0] + ...
        st      r7, 0(r12)
        addb    d2, r5
        add     r7, r0, r0
        dot     r7, d2, d0              ; D[k+1]
        st      r7, 1(r12)
        addb    d2, r5
        addi    r12, r12, 2
        addi    r13, r13, -2
        bne     r13, r0, pb_dot2
pb_dotted:
        bne     r11, r0, pb_xmask
        blt     r6, r0, pb_dxfar
        fadd    d4, d5, d3              ; send in + D
        jmp     pb_wg
pb_dxfar:
        fmov    d4, d3                  ; the far end of the input line: send D
        jmp     pb_wg
pb_xmask:                               ; the line's near end: the previous layer's ReLU mask on the way out
        blt     r6, r0, pb_xmk
        fadd    d3, d5, d3              ; D = in + D
pb_xmk:
        ldsd    d2, PB_XMK(r15)
        ld      r10, f_big(r0)
        fmuls   d2, d7, r10             ; mk = x * -2^127 (x: the previous layer's ReLU outputs)
        ld      r10, f_mone(r0)
        fmaxs   d2, d2, r10             ; mk = max(mk, -1)
        fmul    d3, d3, d2              ; D = D * mk
        fmuls   d4, d3, r10             ; send D * -1: the previous layer's dz
pb_wg:
        fmacw   d6, d0, d7              ; G[k][o] += dz[o] * x[k]
        add     r8, r8, r4
        add     r9, r9, r5
        addi    r3, r3, -1
        beq     r3, r0, op_done
        beq     r14, r0, pb_in
pb_end:                                 ; a chain end: dz, the bias gradient, dz back along the line
        li      r10, 2
        blt     r14, r10, pb_ehost
        beq     r14, r10, pb_enomask
        ldsd    d2, PB_MK(r15)
        ldsd    d7, PB_YS(r15)
        setb    d7, r9
        fmaxs   d2, d7, r0              ; mk = max(ys, +0): the ReLU's output (pfwd keeps y)
        ld      r10, f_big(r0)
        fmuls   d2, d2, r10             ; mk = mk * -2^127
        ld      r10, f_mone(r0)
        fmaxs   d2, d2, r10             ; mk = max(mk, -1)
        fmul    d0, d1, d2              ; dz = dy * mk
        fmuls   d0, d0, r10             ; dz = dz * -1
        ldsd    d7, PB_XG(r15)
        jmp     pb_ebias
pb_ehost:
        ldsd    d7, PB_YS(r15)
        setb    d7, r9
        fmov    d0, d7                  ; dz = the host's delta
        ldsd    d7, PB_XG(r15)
        jmp     pb_ebias
pb_enomask:
        fmov    d0, d1                  ; dz = dy
pb_ebias:
        beq     r1, r0, pb_emcast
        ldsd    d2, PB_DB(r15)
        fadd    d2, d2, d0              ; db = db + dz
pb_emcast:
        beq     r2, r0, pb_dx
        ldsd    d2, PB_DZOUT(r15)
        fmov    d2, d0                  ; dz back along the output line
        jmp     pb_dx

; ---------------------------------------------------------------------------
; pupd: the optimizer on this PE's parameters at the end of a batch: the
; weight tile, then (at the chain ends of a layer with a bias) the bias.
; SGD as torch.optim.SGD defines it, one rounding per operation:
;   g = add(g, mul(w, wd))                        (weight decay)
;   buf = g (first step), else buf = add(mul(buf, mu), mul(g, 1 - dampening))
;   g = add(g, mul(buf, mu)) (Nesterov), else g = buf      (with momentum)
;   w = add(w, mul(g, -lr))
; The record's descriptors come in threes (w, g, buf), the bias's 6 words on.
pupd:
        add     r14, r15, r0
        ld      r3, PU_PARAMS(r15)      ; 1: the tile; 2: the tile and the bias
pu_param:
        ldsd    d0, PU_W(r14)
        ldsd    d1, PU_G(r14)
        ldsd    d2, PU_M(r14)
        ld      r10, PU_WD(r15)
        beq     r10, r0, pu_mom
        ld      r11, PU_RWD(r15)
        fmacs   d1, d1, d0, r11         ; g = g + w * wd
pu_mom:
        ld      r10, PU_MOM(r15)
        beq     r10, r0, pu_step
        ld      r10, PU_FIRST(r15)
        beq     r10, r0, pu_buf
        fmov    d2, d1                  ; the first step: buf = g
        jmp     pu_nest
pu_buf:
        ld      r11, PU_RMU(r15)
        fmuls   d2, d2, r11             ; buf = buf * mu
        ld      r11, PU_RDAMP(r15)
        fmacs   d2, d2, d1, r11         ; buf = buf + g * (1 - dampening)
pu_nest:
        ld      r10, PU_NEST(r15)
        beq     r10, r0, pu_plain
        ld      r11, PU_RMU(r15)
        fmacs   d1, d1, d2, r11         ; g = g + buf * mu
        jmp     pu_step
pu_plain:
        ldsd    d1, PU_M(r14)           ; g = buf
pu_step:
        ld      r11, PU_RLR(r15)
        fmacs   d0, d0, d1, r11         ; w = w + g * (-lr)
        addi    r14, r14, 6
        addi    r3, r3, -1
        bne     r3, r0, pu_param
        jmp     op_done

; ---------------------------------------------------------------------------
; psfwd: the forward pass with activation sparsity harvesting, in its own file.
        .include "pipe_sparse.s"

; ---------------------------------------------------------------------------
; pvop: `n` vector instructions from the record, one after another, each
; `fmov d, a` (op 0) or `fadd d, a, b` (op 1), PV_ENTRY words an entry (the
; first at PV_OP); their descriptors may be fabric ones. The replicas'
; gradient reduction (docs/layer_pipelined.md section 6b) is made of them:
; a running sum passed east along a row of PEs, copy after copy, and the
; final sum passed back west.
pvop:
        ld      r3, PV_N(r15)
        addi    r9, r15, PV_OP
pv_next:
        ld      r10, 0(r9)
        ldsd    d0, 1(r9)
        ldsd    d1, 3(r9)
        bne     r10, r0, pv_add
        fmov    d0, d1
        jmp     pv_step
pv_add:
        ldsd    d2, 5(r9)
        fadd    d0, d1, d2
pv_step:
        addi    r9, r9, PV_ENTRY
        addi    r3, r3, -1
        bne     r3, r0, pv_next
        jmp     op_done

        .task T_RUN, run
