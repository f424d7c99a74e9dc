; dot: s = sum x[i] * y[i] with y spread over the mesh and x streamed through it.
;
; x and y are laid out as for axpy: PE (j, i) holds a contiguous slice of y,
; the x elements of mesh row i enter at its west edge in PE order, each PE
; takes the first `p_own` of them and forwards the next `p_rest` east (colors
; `p_xin` / `p_xout`, alternating by column parity).
;
; Order of the float operations:
;   part(j, i) = +0; part = add(part, mul(y[k], x[k])) for k in the slice, in order
;   row(i)     = part(0, i); row = add(row, part(j, i)) for j = 1 .. W-1
;                (PE j receives the row sum so far from the west and sends
;                 add(in, part) east; the east column keeps it)
;   s          = row(0); s = add(s, row(i)) for i = 1 .. H-1
;                (down the east column, the same way, north to south)
; s leaves the mesh at the south edge of the east column.

        .equ T_START, 6         ; local task launched by the host

        .data
p_own:    .word 0               ; elements of y held here
p_rest:   .word 0               ; x elements to forward east
p_y:      .word 0               ; address of the y slice
p_xin:    .word 0               ; color x arrives on (from the west)
p_xout:   .word 0               ; color x leaves on (to the east)
p_first:  .word 0               ; 1 in column 0 (no row sum comes from the west)
p_last:   .word 0               ; 1 in the east column (which also sums down the column)
p_top:    .word 0               ; 1 in row 0 (no column sum comes from the north)
p_rin:    .word 0               ; color of the row sum arriving from the west
p_rout:   .word 0               ; color of the row sum leaving to the east
p_cin:    .word 0               ; color of the column sum arriving from the north
p_cout:   .word 0               ; color of the column sum leaving to the south
part:     .word 0               ; this PE's partial sum
t_mem:    .dsd mem, base=0, len=0, stride=1
t_part:   .dsd mem, base=part, len=1, stride=1
t_fabin:  .dsd fabin, color=0, len=0
t_fabin1: .dsd fabin, color=0, len=1
t_fabout: .dsd fabout, color=0, len=0
t_fabout1: .dsd fabout, color=0, len=1

        .text
start:
        ld      r3, p_own(r0)
        ld      r4, p_y(r0)
        ld      r5, p_xin(r0)
        ldsd    d0, t_mem(r0)   ; d0 = y slice
        setb    d0, r4
        setl    d0, r3
        ldsd    d1, t_fabin(r0) ; d1 = x from the west
        setb    d1, r5
        li      r8, 0
        dot     r8, d0, d1      ; r8 = r8 + y[k] * x[k], in order
        st      r8, part(r0)
; Forward the rest in pieces of at most 65535 (the descriptor length field).
        ld      r3, p_rest(r0)
        ld      r5, p_xout(r0)
        ldsd    d2, t_fabout(r0)
        setb    d2, r5
        li      r7, 65535
forward:
        bge     r7, r3, forward_last
        setl    d2, r7
        fmov    d2, d1
        sub     r3, r3, r7
        jmp     forward
forward_last:
        setl    d2, r3
        fmov    d2, d1
; Row sum: d3 = part, d4 = sum in, d5 = sum out.
        ldsd    d3, t_part(r0)
        ld      r5, p_rin(r0)
        ldsd    d4, t_fabin1(r0)
        setb    d4, r5
        ld      r5, p_rout(r0)
        ldsd    d5, t_fabout1(r0)
        setb    d5, r5
        ld      r3, p_first(r0)
        ld      r4, p_last(r0)
        bne     r4, r0, row_last
        bne     r3, r0, row_first
        fadd    d5, d4, d3      ; send in + part east
        exit
row_first:
        fmov    d5, d3          ; send part east
        exit
row_last:
        bne     r3, r0, column  ; a one-column mesh: part is the row sum
        fadd    d3, d4, d3      ; part = in + part: the row sum
; Column sum down the east column.
column:
        ld      r5, p_cin(r0)
        setb    d4, r5
        ld      r5, p_cout(r0)
        setb    d5, r5
        ld      r3, p_top(r0)
        bne     r3, r0, column_first
        fadd    d5, d4, d3      ; send in + row sum south
        exit
column_first:
        fmov    d5, d3          ; send the row sum south
        exit

        .task T_START, start
