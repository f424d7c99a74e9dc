; reduce: the elementwise sum of the vectors of every PE of a line (mesh row
; or column), leaving the mesh at the end of the line.
;
; Each PE holds `p_n` words at `p_buf`. The first PE of a line sends its
; vector on; every later PE sends out[k] = add(in[k], v[k]) with `in` from
; the previous PE, so the sum is a fold in line order:
;   out(0) = v(0); out(m) = add(out(m-1), v(m)); the last PE's out leaves the mesh.
; The link into PE m and the link out of it use two colors that alternate by
; position parity (a color has one input per router); the host writes them
; into `p_cin` / `p_cout`.

        .equ T_START, 2         ; local task launched by the host

        .data
p_n:      .word 0               ; vector length
p_buf:    .word 0               ; address of the vector
p_first:  .word 0               ; 1 on the first PE of the line
p_cin:    .word 0               ; color of the sums arriving from the previous PE
p_cout:   .word 0               ; color of the sums leaving to the next PE
t_mem:    .dsd mem, base=0, len=0, stride=1
t_fabin:  .dsd fabin, color=0, len=0
t_fabout: .dsd fabout, color=0, len=0

        .text
start:
        ld      r3, p_n(r0)
        ld      r4, p_buf(r0)
        ld      r5, p_cout(r0)
        ldsd    d0, t_mem(r0)   ; d0 = this PE's vector
        setb    d0, r4
        setl    d0, r3
        ldsd    d2, t_fabout(r0); d2 = sums out
        setb    d2, r5
        setl    d2, r3
        ld      r6, p_first(r0)
        bne     r6, r0, first
        ld      r5, p_cin(r0)
        ldsd    d1, t_fabin(r0) ; d1 = sums in
        setb    d1, r5
        fadd    d2, d1, d0      ; out[k] = in[k] + v[k]
        exit
first:
        fmov    d2, d0          ; out[k] = v[k]
        exit

        .task T_START, start
