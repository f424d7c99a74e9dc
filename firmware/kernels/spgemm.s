; spgemm: Y = W X with W sparse and streamed, only its non-zeros on the wire.
;
; One program on every PE of the columns that hold tokens. PE (j, i) holds,
; for the input features dealt to mesh row i, their token blocks x[l] (T
; words each, T = tokens of column j) at `p_x + l*S`; an accumulator of T
; words at `p_acc`; T zero words at `p_zero`; its output slots at `p_y`.
;
; The weight stream of row i enters at the west edge on C_W and is multicast
; east along the row. Per output feature it holds, for every non-zero
; W[o, k] whose feature k lives on row i, an index/value pair (the index is
; the word address of x[l] on every PE of the row, the value the weight's
; binary32 bits), then a carriage return: a control wavelet whose data is
; negative (an index never is) and names the PE's part in that feature's
; partial-sum ring:
;
;   -1 FIRST   send the accumulator south (ring position 0)
;   -2 MID     send add(in, acc), in from the north (positions 1 .. H-2)
;   -3 END     the stream is over: exit
;   0x80000000 | a   LAST: store add(in, acc) at a (position H-1, the home row)
;   0xC0000000 | a   ONLY: store acc at a (a one-row mesh)
;
; A feature's first non-zero starts the accumulator (fmacs from the zero
; block); one fmacx takes the later ones (per index: d1's base set to it,
; the value popped, T multiply-adds into the accumulator) and ends on the
; carriage return, whose data it leaves in r1. A row with no non-zero of the
; feature runs its ring operation on the zero block. Nothing multiplies by a
; weight that is not there.

        .equ C_W, 0             ; color of the weight stream
        .equ T_START, 4         ; local task launched by the host

        .data
p_t:      .word 0               ; tokens here (T)
p_acc:    .word 0               ; address of the accumulator
p_zero:   .word 0               ; address of T zero words
p_cin:    .word 0               ; ring color arriving from the north
p_cout:   .word 0               ; ring color leaving to the south
t_mem:    .dsd mem, base=0, len=0, stride=1
t_fabin:  .dsd fabin, color=0, len=0
t_fabout: .dsd fabout, color=0, len=0

        .text
; d0 acc, d1 x[l], d2 ring in, d3 ring out, d4 weights in, d5 zero, d6 y slot.
start:
        ld      r3, p_t(r0)
        ld      r4, p_acc(r0)
        ld      r5, p_zero(r0)
        ld      r6, p_cin(r0)
        ld      r7, p_cout(r0)
        ldsd    d0, t_mem(r0)
        setb    d0, r4
        setl    d0, r3
        ldsd    d1, t_mem(r0)
        setl    d1, r3
        ldsd    d5, t_mem(r0)
        setb    d5, r5
        setl    d5, r3
        ldsd    d6, t_mem(r0)
        setl    d6, r3
        ldsd    d2, t_fabin(r0)
        setb    d2, r6
        ldsd    d3, t_fabout(r0)
        setb    d3, r7
        setl    d3, r3
        ldsd    d4, t_fabin(r0)
        li      r8, C_W
        setb    d4, r8
        li      r11, -2
        li      r12, -3
        lui     r13, 0xC000

; A new output feature: nothing accumulated yet.
feature:
        recv    r1, C_W
        blt     r1, r0, cr_zero
        setb    d1, r1
        recv    r8, C_W
        fmacs   d0, d5, d1, r8  ; acc = +0 + x[l] * w
        fmacx   d0, d1, d4, C_W, r1     ; acc += x[l] * w per later pair; r1 = the carriage return
; Carriage return after at least one non-zero: the ring operation on acc.
        blt     r1, r12, acc_store
        beq     r1, r11, acc_mid
        fmov    d3, d0          ; FIRST: out = acc
        jmp     feature
acc_mid:
        fadd    d3, d2, d0      ; MID: out = add(in, acc)
        jmp     feature
acc_store:
        setb    d6, r1
        blt     r1, r13, acc_last
        fmov    d6, d0          ; ONLY: y = acc
        jmp     feature
acc_last:
        fadd    d6, d2, d0      ; LAST: y = add(in, acc)
        jmp     feature

; Carriage return with no non-zero on this row: the ring operation on +0.
cr_zero:
        blt     r1, r12, zero_store
        beq     r1, r12, done
        beq     r1, r11, zero_mid
        fmov    d3, d5
        jmp     feature
zero_mid:
        fadd    d3, d2, d5
        jmp     feature
zero_store:
        setb    d6, r1
        blt     r1, r13, zero_last
        fmov    d6, d5
        jmp     feature
zero_last:
        fadd    d6, d2, d5
        jmp     feature
done:
        exit

        .task T_START, start
