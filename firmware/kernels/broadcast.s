; broadcast: the vector of one PE of each line (mesh row or column) is copied
; into every PE of that line.
;
; The source PE (the first of its line) sends its `p_n` words at `p_buf` on
; color `p_color`; the route multicasts them along the line (each router
; takes the color from the previous one and sends it to its PE and on to the
; next; the last sends it to its PE only). Every other PE of the line stores
; the `p_n` words it receives at `p_buf`. All lines run at once, on the same
; color (their routers are disjoint). `p_send` is 0 for a source alone in its
; line, which has nobody to send to.

        .equ T_START, 1         ; local task launched by the host

        .data
p_n:      .word 0               ; vector length
p_buf:    .word 0               ; address of the vector
p_color:  .word 0               ; color of the line's multicast
p_source: .word 0               ; 1 on the source PE of the line
p_send:   .word 0               ; elements the source sends
t_mem:    .dsd mem, base=0, len=0, stride=1
t_fabin:  .dsd fabin, color=0, len=0
t_fabout: .dsd fabout, color=0, len=0

        .text
start:
        ld      r3, p_n(r0)
        ld      r4, p_buf(r0)
        ld      r5, p_color(r0)
        ldsd    d0, t_mem(r0)   ; d0 = the vector
        setb    d0, r4
        setl    d0, r3
        ld      r6, p_source(r0)
        bne     r6, r0, source
        ldsd    d1, t_fabin(r0)
        setb    d1, r5
        fmov    d0, d1          ; store what arrives
        exit
source:
        ld      r3, p_send(r0)
        ldsd    d1, t_fabout(r0)
        setb    d1, r5
        setl    d1, r3
        fmov    d1, d0          ; send the vector
        exit

        .task T_START, start
