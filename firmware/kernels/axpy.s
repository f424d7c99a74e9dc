; axpy: y = a*x + y with y spread over the mesh and x streamed through it.
;
; Every PE holds a contiguous slice of y (`p_own` words at `p_y`). The x
; elements of a mesh row enter at its west edge in PE order: first the
; slice of PE 0 of the row, then PE 1's, and so on. Each PE consumes the
; first `p_own` elements it receives, y[i] = add(y[i], mul(x[i], a)), then
; forwards the next `p_rest` elements (those of the PEs east of it)
; unchanged. The link into PE j and the link out of it use two colors that
; alternate by column parity; the host writes both into `p_xin` / `p_xout`.

        .equ T_START, 2         ; local task launched by the host

        .data
p_own:    .word 0               ; elements of y held here
p_rest:   .word 0               ; elements to forward east
p_y:      .word 0               ; address of the y slice
p_a:      .word 0               ; the scalar a (binary32 bits)
p_xin:    .word 0               ; color x arrives on (from the west)
p_xout:   .word 0               ; color x leaves on (to the east)
t_mem:    .dsd mem, base=0, len=0, stride=1
t_fabin:  .dsd fabin, color=0, len=0
t_fabout: .dsd fabout, color=0, len=0

        .text
start:
        ld      r3, p_own(r0)
        ld      r4, p_y(r0)
        ld      r5, p_xin(r0)
        ld      r6, p_a(r0)
        ldsd    d0, t_mem(r0)   ; d0 = y slice
        setb    d0, r4
        setl    d0, r3
        ldsd    d1, t_fabin(r0) ; d1 = x from the west
        setb    d1, r5
        fmacs   d0, d0, d1, r6  ; y[i] = y[i] + x[i] * a
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
        exit

        .task T_START, start
