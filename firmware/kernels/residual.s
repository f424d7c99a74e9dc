; residual: y = add(a, b) elementwise over the block of activations every PE
; holds (the residual additions of a transformer and the sums of the
; gradients a value gets from several readers, docs/transformer.md
; sections 3.5 and 11).
;
; Every PE holds `p_n` elements of each operand in the streamed GEMM's layout
; (its features x its tokens); `p_heap` is the first free word and the
; buffers A, B, Y follow it, `p_n` words each. One vector instruction, one
; binary32 add per element; nothing touches the fabric.

        .equ T_START, 0

        .data
p_n:      .word 0               ; elements held here
p_heap:   .word 0               ; first free word: A, B, Y start here
t_mem:    .dsd mem, base=0, len=0, stride=1

        .text
start:
        ld      r3, p_n(r0)
        beq     r3, r0, done            ; nothing held here
        ld      r4, p_heap(r0)
        ldsd    d0, t_mem(r0)           ; d0 = A
        setb    d0, r4
        setl    d0, r3
        add     r4, r4, r3
        ldsd    d1, t_mem(r0)           ; d1 = B
        setb    d1, r4
        setl    d1, r3
        add     r4, r4, r3
        ldsd    d2, t_mem(r0)           ; d2 = Y
        setb    d2, r4
        setl    d2, r3
        fadd    d2, d0, d1              ; y = add(a, b)
done:
        exit

        .task T_START, start
