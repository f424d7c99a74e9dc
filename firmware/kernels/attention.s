; attention: the products of one causal attention head, activations times
; activations, in the order of firmware/training/transformer.py's attention /
; attention_backward (docs/transformer.md sections 3.4 and 9).
;
; The T x T block layout is the softmax kernel's: queries dealt over the mesh
; rows, keys over the columns, in contiguous blocks; PE (x, y) holds the
; `p_r` queries from `p_q0` times the `p_k` keys from `p_k0`, key-major (the
; R queries of one key contiguous). Query i sees keys j <= i only.
;
; Operands that are rows of a T x Dh matrix arrive by the router: the rows of
; a mesh row's queries (Q or dO, R x Dh, token-major) enter at the west edge
; and are multicast along the row (color `p_rcolor`) into ROW; the rows of a
; column's keys (K or V, K x Dh) enter at the north edge and are multicast
; down the column (color `p_ccolor`) into COL. A T x T operand (p, ds) is
; already in BLK, where the softmax kernel leaves it.
;
; p_mode 0, the local products (scores, dp), into OUT (K x R, key-major):
;   out[j, i] = +0 + mul(ROW[i, 0], COL[j, 0]) + ... (d ascending), times
;   p_scale when p_scaled; only j <= i is computed, the rest stays +0.
; p_mode 1, a sum over keys (o = p v, dq = ds k), into OUT (R x Dh): a chain
;   east along the mesh row, one query's row of Dh words at a time; the west
;   PE starts each row from +0, every PE folds its visible keys in order,
;   out[i, :] = add(out[i, :], mul(COL[j, :], BLK[j, i])) for
;   j = k0 .. min(k0 + K - 1, i), and passes the row east; the last PE of the
;   chain (`p_last`) keeps the result.
; p_mode 2, a sum over queries (dv = p^T do, dk = ds^T q), into OUT (K x Dh):
;   a chain south down the column, one key's row at a time;
;   out[j, :] = add(out[j, :], mul(ROW[i, :], BLK[j, i])) for
;   i = max(j, q0) .. q0 + R - 1, in order; the last PE of the chain keeps it.
; The chains are wavefronts: a PE folds row i while the next one folds row
; i - 1.
;
; Registers: r2 = Dh, r3 = R, r4 = K, r11 = 1; d0 = OUT (or one row of it).
; A local product is one `dot` (rd = add(rd, mul(a, b)) element by element);
; a chain's fold is one `fmacs` per term (dd = add(da, mul(db, rs))).

        .equ T_START, 0

        .data
p_r:      .word 0               ; queries held here
p_k:      .word 0               ; keys held here
p_q0:     .word 0               ; first query
p_k0:     .word 0               ; first key
p_dh:     .word 0               ; head width
p_mode:   .word 0               ; 0 local products, 1 chain east, 2 chain south
p_rowin:  .word 0               ; 1: receive R x Dh into ROW
p_colin:  .word 0               ; 1: receive K x Dh into COL
p_rcolor: .word 0               ; color of the row multicast
p_ccolor: .word 0               ; color of the column multicast
p_scaled: .word 0               ; 1: multiply the local products by p_scale
p_scale:  .word 0
p_first:  .word 0               ; 1: the chain starts here (from +0)
p_last:   .word 0               ; 1: the chain ends here (the result)
p_cin:    .word 0               ; chain color in
p_cout:   .word 0               ; chain color out
p_row:    .word 0               ; buffer addresses
p_col:    .word 0
p_blk:    .word 0
p_out:    .word 0
t_mem:    .dsd mem, base=0, len=0, stride=1
t_k:      .dsd mem, base=0, len=0, stride=0
t_in:     .dsd fabin, color=0, len=0
t_out:    .dsd fabout, color=0, len=0
k_zero:   .word 0

        .text
start:
        ld      r3, p_r(r0)
        beq     r3, r0, done            ; no queries here
        ld      r4, p_k(r0)
        beq     r4, r0, done            ; no keys here
        ld      r2, p_dh(r0)
        li      r11, 1
        ld      r5, p_rowin(r0)
        beq     r5, r0, no_row
        ldsd    d1, t_mem(r0)           ; ROW = the row multicast
        ld      r5, p_row(r0)
        setb    d1, r5
        mul     r6, r3, r2
        setl    d1, r6
        ldsd    d2, t_in(r0)
        ld      r5, p_rcolor(r0)
        setb    d2, r5
        fmov    d1, d2
no_row:
        ld      r5, p_colin(r0)
        beq     r5, r0, no_col
        ldsd    d1, t_mem(r0)           ; COL = the column multicast
        ld      r5, p_col(r0)
        setb    d1, r5
        mul     r6, r4, r2
        setl    d1, r6
        ldsd    d2, t_in(r0)
        ld      r5, p_ccolor(r0)
        setb    d2, r5
        fmov    d1, d2
no_col:
        ld      r5, p_mode(r0)
        beq     r5, r0, local
        jmp     chain_setup

; mode 0: OUT = +0, then every visible (key, query) is one dot of length Dh
local:
        ldsd    d0, t_mem(r0)
        ld      r5, p_out(r0)
        setb    d0, r5
        mul     r12, r3, r4
        setl    d0, r12
        ldsd    d7, t_k(r0)
        li      r5, k_zero
        setb    d7, r5
        fmov    d0, d7
        ld      r10, p_scaled(r0)
        ld      r1, p_scale(r0)
        ldsd    d1, t_mem(r0)           ; a row of ROW
        setl    d1, r2
        ldsd    d2, t_mem(r0)           ; a row of COL
        setl    d2, r2
        ld      r7, p_k0(r0)
        ld      r5, p_q0(r0)
        sub     r7, r7, r5              ; j - q0 for the first key
        ld      r8, p_col(r0)           ; COL row of key j
        ld      r9, p_out(r0)           ; OUT column of key j
        add     r13, r4, r0
lk_key:
        beq     r13, r0, done
        add     r6, r7, r0              ; off = max(j - q0, 0)
        bge     r6, r0, lk_off
        li      r6, 0
lk_off:
        sub     r14, r3, r6             ; visible queries of key j
        bge     r0, r14, done           ; none: none for the later keys either
        setb    d2, r8
        mul     r5, r6, r2
        ld      r15, p_row(r0)
        add     r5, r5, r15
        setb    d1, r5
        add     r15, r9, r6
lk_query:
        li      r5, 0
        dot     r5, d1, d2              ; +0 + mul(row[i, 0], col[j, 0]) + ...
        beq     r10, r0, lk_store
        sfmul   r5, r5, r1              ; mul(sum, scale)
lk_store:
        st      r5, 0(r15)
        addb    d1, r2
        addi    r15, r15, 1
        addi    r14, r14, -1
        bne     r14, r0, lk_query
        add     r8, r8, r2
        add     r9, r9, r3
        addi    r7, r7, 1
        addi    r13, r13, -1
        jmp     lk_key

done:
        exit

; the chains, one row of Dh words at a time (a wavefront: a PE folds row i
; while the next PE folds row i - 1): d0 = the row of OUT, d3 = the chain
; from the previous PE, d4 = on to the next, d7 = +0; r10 = first, r12 = last
chain_setup:
        ldsd    d0, t_mem(r0)
        setl    d0, r2
        ldsd    d2, t_mem(r0)
        setl    d2, r2
        ldsd    d3, t_in(r0)
        ld      r5, p_cin(r0)
        setb    d3, r5
        ldsd    d4, t_out(r0)
        ld      r5, p_cout(r0)
        setb    d4, r5
        setl    d4, r2
        ldsd    d7, t_k(r0)
        li      r5, k_zero
        setb    d7, r5
        ld      r10, p_first(r0)
        ld      r12, p_last(r0)
        ld      r9, p_out(r0)
        ld      r8, p_blk(r0)
        ld      r5, p_mode(r0)
        beq     r5, r11, east_rows
        jmp     south_keys

; mode 1: per query i, out[i, :] from the west (or +0), then for the keys
; j = k0 .. min(k0 + K - 1, i): out[i, :] = add(out[i, :], mul(COL[j, :], BLK[j, i]))
east_rows:
        ld      r7, p_q0(r0)
        ld      r5, p_k0(r0)
        sub     r7, r7, r5
        addi    r7, r7, 1               ; visible keys of query q0 (before the min with K)
        add     r13, r3, r0
e_row:
        setb    d0, r9
        bne     r10, r0, e_zero
        fmov    d0, d3                  ; the partial from the west
        jmp     e_fold
e_zero:
        fmov    d0, d7                  ; +0
e_fold:
        add     r14, r7, r0
        blt     r14, r4, e_min
        add     r14, r4, r0
e_min:
        bge     r0, r14, e_send         ; no visible key
        ld      r5, p_col(r0)
        setb    d2, r5
        add     r15, r8, r0
e_key:
        ld      r5, 0(r15)
        fmacs   d0, d0, d2, r5          ; add(out[i, d], mul(v[j, d], p[i, j])), j ascending
        addb    d2, r2
        add     r15, r15, r3
        addi    r14, r14, -1
        bne     r14, r0, e_key
e_send:
        bne     r12, r0, e_next         ; the chain ends here: keep it
        fmov    d4, d0                  ; on to the east
e_next:
        addi    r8, r8, 1
        add     r9, r9, r2
        addi    r7, r7, 1
        addi    r13, r13, -1
        bne     r13, r0, e_row
        jmp     done

; mode 2: per key j, out[j, :] from the north (or +0), then for the queries
; i = max(j, q0) .. q0 + R - 1: out[j, :] = add(out[j, :], mul(ROW[i, :], BLK[j, i]))
south_keys:
        ld      r7, p_k0(r0)
        ld      r5, p_q0(r0)
        sub     r7, r7, r5              ; j - q0 for the first key
        add     r13, r4, r0
s_key:
        setb    d0, r9
        bne     r10, r0, s_zero
        fmov    d0, d3                  ; the partial from the north
        jmp     s_fold
s_zero:
        fmov    d0, d7                  ; +0
s_fold:
        add     r6, r7, r0              ; off = max(j - q0, 0)
        bge     r6, r0, s_off
        li      r6, 0
s_off:
        sub     r14, r3, r6             ; visible queries of key j
        bge     r0, r14, s_send
        mul     r5, r6, r2
        ld      r15, p_row(r0)
        add     r5, r5, r15
        setb    d2, r5
        add     r15, r8, r6
s_query:
        ld      r5, 0(r15)
        fmacs   d0, d0, d2, r5          ; add(out[j, d], mul(do[i, d], p[i, j])), i ascending
        addb    d2, r2
        addi    r15, r15, 1
        addi    r14, r14, -1
        bne     r14, r0, s_query
s_send:
        bne     r12, r0, s_next         ; the chain ends here: keep it
        fmov    d4, d0                  ; on to the south
s_next:
        add     r8, r8, r3
        add     r9, r9, r2
        addi    r7, r7, 1
        addi    r13, r13, -1
        bne     r13, r0, s_key
        jmp     done

        .task T_START, start
