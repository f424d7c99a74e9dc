; gemv: y = W x with the weights stationary, one program on every PE.
;
; PE (j, i) holds the block W[rows_i, cols_j] column-major at `p_w` (column k
; of the block is nrows contiguous words) and an accumulator of nrows words at
; `p_acc` (zero when the program is loaded).
;
; 1. The host launches T_START: it loads the descriptors and unblocks the data
;    task of C_X, so no x element is handled before the descriptors are set.
; 2. x[cols_j] enters column j at the north edge on C_X and is multicast down
;    the column. Each element runs `xtask`: acc[r] = add(acc[r], mul(W[r, k], x[k]))
;    over the PE's rows, then the weight descriptor moves to the next column.
; 3. After the PE's last element (at once for a PE whose column has no x),
;    T_REDUCE runs the row reduction: column 0 sends acc east unchanged, every
;    other column sends add(in, acc) with `in` the partial sum from the west.
;    The east column's output leaves the mesh at the east edge as y[rows_i].
;
; Colors of the reduction alternate by column parity (a color has one input
; per router); the host writes them, like every per-PE value, into the
; parameter words below.

        .equ C_X, 0             ; color of the x stream (the data task's color)
        .equ T_START, 3         ; local task launched by the host
        .equ T_REDUCE, 4        ; local task: the row reduction

        .data
p_nrows:  .word 0               ; rows of W held here (accumulator length)
p_ncols:  .word 0               ; x elements this PE will receive
p_acc:    .word 0               ; address of the accumulator
p_w:      .word 0               ; address of the weight block
p_first:  .word 0               ; 1 in column 0 (no partial sum comes from the west)
p_cin:    .word 0               ; color of the partial sums arriving from the west
p_cout:   .word 0               ; color of the partial sums leaving to the east
t_mem:    .dsd mem, base=0, len=0, stride=1
t_fabin:  .dsd fabin, color=0, len=0
t_fabout: .dsd fabout, color=0, len=0

        .text
; d0 = accumulator, d1 = current weight column; r3 = nrows, r6 = x still to come.
start:
        ld      r3, p_nrows(r0)
        ld      r4, p_acc(r0)
        ld      r5, p_w(r0)
        ld      r6, p_ncols(r0)
        ldsd    d0, t_mem(r0)
        setb    d0, r4
        setl    d0, r3
        ldsd    d1, t_mem(r0)
        setb    d1, r5
        setl    d1, r3
        unblock C_X
        bne     r6, r0, start_done
        activate T_REDUCE       ; no x for this column: reduce at once
start_done:
        exit

; One x element in r1.
xtask:
        fmacs   d0, d0, d1, r1  ; acc[r] = acc[r] + W[r, k] * x[k]
        addb    d1, r3          ; next weight column
        addi    r6, r6, -1
        beq     r6, r0, x_last
        exit
x_last:
        activate T_REDUCE
        exit

; Row reduction: d2 = partial sums out (east), d3 = partial sums in (west).
reduce:
        ld      r7, p_cout(r0)
        ldsd    d2, t_fabout(r0)
        setb    d2, r7
        setl    d2, r3
        ld      r8, p_first(r0)
        bne     r8, r0, reduce_first
        ld      r7, p_cin(r0)
        ldsd    d3, t_fabin(r0)
        setb    d3, r7
        fadd    d2, d3, d0      ; out[r] = in[r] + acc[r]
        exit
reduce_first:
        fmov    d2, d0          ; out[r] = acc[r]
        exit

        .task T_START, start
        .task T_REDUCE, reduce
        .data_task C_X, xtask, blocked
