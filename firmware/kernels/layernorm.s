; layernorm: LayerNorm forward over the features of every token, in the order
; of firmware/training/transformer.py's layernorm (docs/transformer.md 3.2).
;
; Feature k lives on mesh row k mod H, the tokens are dealt over the columns:
; PE (x, y) holds `p_f` features times `p_t` tokens in X, feature-major (the
; t tokens of one feature are contiguous), and the gamma and beta of its
; features in G and B. A feature sum runs as:
;   P = +0; P = add(P, v[feature]) for the PE's features in order  (a vector over its tokens)
;   down the column, a chain: S = P (row 0); S = add(S from the north, P) (row y)
; The south PE holds the sum; it finishes it once per token (mean = mul(S, 1/D);
; or r = rsqrt(add(mul(S, 1/D), eps))) and sends it back north along a second
; chain (colors `p_bin` / `p_bout`), every PE keeping a copy. Then
;   xc = sub(x, mean);  var's sum of mul(xc, xc) the same way;  xhat = mul(xc, r)
;   y  = add(mul(xhat, gamma), beta)                                     -> Y
; and leaves xhat in XC (in place of xc) and r in S, as the backward pass takes them.
;
; Buffers from `p_heap`: X, XC, SQ, Y (f*t words each), P, S, HH, YR, Q (t each),
; G, B (f each). Registers: r3 = f, r4 = t, r12 = f*t; the chain returns
; through r13 (1 mean, 2 r).

        .equ T_START, 0

        .data
p_f:      .word 0               ; features held here
p_t:      .word 0               ; tokens held here (the same down a column)
p_heap:   .word 0               ; first free word
p_invd:   .word 0               ; binary32 1/D
p_first:  .word 0               ; 1 in row 0
p_last:   .word 0               ; 1 in the south row
p_cin:    .word 0               ; chain colors: the sum so far from the north ..
p_cout:   .word 0               ; .. and on to the south
p_bin:    .word 0               ; the result coming back from the south ..
p_bout:   .word 0               ; .. and on to the north
a_x:      .word 0               ; buffer addresses
a_xc:     .word 0
a_sq:     .word 0
a_y:      .word 0
a_p:      .word 0
a_s:      .word 0
a_hh:     .word 0
a_yr:     .word 0
a_q:      .word 0
a_g:      .word 0
a_b:      .word 0
t_mem:    .dsd mem, base=0, len=0, stride=1
t_k:      .dsd mem, base=0, len=0, stride=0
t_in:     .dsd fabin, color=0, len=0
t_out:    .dsd fabout, color=0, len=0
k_zero:   .word 0
k_half:   .word 0x3F000000
k_3half:  .word 0x3FC00000
k_eps:    .word LN_EPS
rsqrt_magic: .word RSQRT_MAGIC

        .text
start:
        ld      r4, p_t(r0)
        beq     r4, r0, done            ; no tokens in this column
        ld      r3, p_f(r0)
        mul     r12, r3, r4
        ld      r5, p_heap(r0)
        st      r5, a_x(r0)
        add     r5, r5, r12
        st      r5, a_xc(r0)
        add     r5, r5, r12
        st      r5, a_sq(r0)
        add     r5, r5, r12
        st      r5, a_y(r0)
        add     r5, r5, r12
        st      r5, a_p(r0)
        add     r5, r5, r4
        st      r5, a_s(r0)
        add     r5, r5, r4
        st      r5, a_hh(r0)
        add     r5, r5, r4
        st      r5, a_yr(r0)
        add     r5, r5, r4
        st      r5, a_q(r0)
        add     r5, r5, r4
        st      r5, a_g(r0)
        add     r5, r5, r3
        st      r5, a_b(r0)
        ldsd    d0, t_mem(r0)           ; d0 = P (t), d1 = a feature's tokens, d7 = a constant
        ld      r5, a_p(r0)
        setb    d0, r5
        setl    d0, r4
        ldsd    d1, t_mem(r0)
        setl    d1, r4
        ldsd    d7, t_k(r0)
        setl    d7, r4
; P = feature sum of x, then its chain
        ld      r1, a_x(r0)
        li      r13, 1
        jmp     psum
mean_done:                              ; S = mean on every PE of the column
        ld      r5, a_s(r0)
        ldsd    d2, t_mem(r0)
        setb    d2, r5
        setl    d2, r4
        ld      r5, a_x(r0)
        setb    d1, r5
        ldsd    d3, t_mem(r0)
        ld      r5, a_xc(r0)
        setb    d3, r5
        setl    d3, r4
        add     r8, r3, r0
        beq     r8, r0, xc_done
xc_loop:                                ; xc = sub(x, mean), feature by feature
        fsub    d3, d1, d2
        addb    d1, r4
        addb    d3, r4
        addi    r8, r8, -1
        bne     r8, r0, xc_loop
        ld      r5, a_xc(r0)            ; SQ = mul(xc, xc), all at once
        setb    d1, r5
        setl    d1, r12
        ld      r5, a_sq(r0)
        setb    d3, r5
        setl    d3, r12
        fmul    d3, d1, d1
        setl    d1, r4
xc_done:
        ld      r1, a_sq(r0)
        li      r13, 2
        jmp     psum
r_done:                                 ; S = r on every PE of the column
        ld      r5, a_xc(r0)
        setb    d1, r5
        ldsd    d3, t_mem(r0)
        ld      r5, a_y(r0)
        setb    d3, r5
        setl    d3, r4
        ld      r6, a_g(r0)
        ld      r7, a_b(r0)
        add     r8, r3, r0
        beq     r8, r0, done
y_loop:                                 ; y = add(mul(mul(xc, r), gamma), beta)
        fmul    d1, d1, d2              ; xhat = mul(xc, r), kept in XC for the backward pass
        ld      r5, 0(r6)
        fmuls   d3, d1, r5
        ld      r5, 0(r7)
        fadds   d3, d3, r5
        addb    d1, r4
        addb    d3, r4
        addi    r6, r6, 1
        addi    r7, r7, 1
        addi    r8, r8, -1
        bne     r8, r0, y_loop
done:
        exit

; P = +0; P = add(P, v[feature]) over the features, v from r1; then the chain
psum:
        li      r5, k_zero
        setb    d7, r5
        fmov    d0, d7
        setb    d1, r1
        add     r8, r3, r0
        beq     r8, r0, psum_done
psum_loop:
        fadd    d0, d0, d1
        addb    d1, r4
        addi    r8, r8, -1
        bne     r8, r0, psum_loop
psum_done:
        jmp     chain

; The chain down the column and back (r13: 1 mean, 2 r); S (d2) gets the result
chain:
        ldsd    d2, t_mem(r0)
        ld      r5, a_s(r0)
        setb    d2, r5
        setl    d2, r4
        ld      r9, p_first(r0)
        ld      r10, p_last(r0)
        bne     r9, r0, chain_first
        ldsd    d3, t_in(r0)
        ld      r5, p_cin(r0)
        setb    d3, r5
        bne     r10, r0, chain_fold_last
        ldsd    d4, t_out(r0)
        ld      r5, p_cout(r0)
        setb    d4, r5
        setl    d4, r4
        fadd    d4, d3, d0              ; add(S from the north, P), on to the south
        jmp     chain_back
chain_fold_last:
        fadd    d2, d3, d0              ; the column's sum
        jmp     chain_finish
chain_first:
        bne     r10, r0, chain_alone
        ldsd    d4, t_out(r0)
        ld      r5, p_cout(r0)
        setb    d4, r5
        setl    d4, r4
        fmov    d4, d0                  ; S = P, on to the south
        jmp     chain_back
chain_alone:
        fmov    d2, d0                  ; one row: S = P
chain_finish:                           ; the south PE: mean, or r
        ld      r5, p_invd(r0)
        fmuls   d2, d2, r5              ; mul(S, 1/D)
        li      r5, 1
        beq     r13, r5, chain_north
        ld      r5, k_eps(r0)
        fadds   d2, d2, r5              ; add(var, eps)
; rsqrt of S into S: y = RSQRT_MAGIC - (bits >> 1); h = mul(x, 0.5);
; twice y = mul(y, sub(1.5, mul(h, mul(y, y)))); once y = add(y, mul(y, sub(0.5, mul(h, mul(y, y)))))
        ld      r6, rsqrt_magic(r0)
        ld      r7, a_s(r0)
        ld      r8, a_yr(r0)
        add     r9, r4, r0
rsqrt_seed:
        ld      r5, 0(r7)
        shri    r5, r5, 1
        sub     r5, r6, r5
        st      r5, 0(r8)
        addi    r7, r7, 1
        addi    r8, r8, 1
        addi    r9, r9, -1
        bne     r9, r0, rsqrt_seed
        ldsd    d3, t_mem(r0)           ; d3 = h, d4 = y, d5 = q
        ld      r5, a_hh(r0)
        setb    d3, r5
        setl    d3, r4
        ldsd    d4, t_mem(r0)
        ld      r5, a_yr(r0)
        setb    d4, r5
        setl    d4, r4
        ldsd    d5, t_mem(r0)
        ld      r5, a_q(r0)
        setb    d5, r5
        setl    d5, r4
        ld      r5, k_half(r0)
        fmuls   d3, d2, r5
        li      r5, k_3half
        setb    d7, r5
        li      r8, 2
rsqrt_newton:
        fmul    d5, d4, d4
        fmul    d5, d3, d5
        fsub    d5, d7, d5
        fmul    d4, d4, d5
        addi    r8, r8, -1
        bne     r8, r0, rsqrt_newton
        li      r5, k_half
        setb    d7, r5
        fmul    d5, d4, d4
        fmul    d5, d3, d5
        fsub    d5, d7, d5
        fmul    d5, d4, d5
        fadd    d2, d4, d5              ; S = r
chain_north:
        ld      r5, p_first(r0)
        bne     r5, r0, chain_ret       ; one row
        ldsd    d4, t_out(r0)
        ld      r5, p_bout(r0)
        setb    d4, r5
        setl    d4, r4
        fmov    d4, d2                  ; back north
        jmp     chain_ret
chain_back:
        ldsd    d3, t_in(r0)
        ld      r5, p_bin(r0)
        setb    d3, r5
        fmov    d2, d3                  ; the result, from the south
        bne     r9, r0, chain_ret       ; row 0: nobody further north
        ldsd    d4, t_out(r0)
        ld      r5, p_bout(r0)
        setb    d4, r5
        setl    d4, r4
        fmov    d4, d2                  ; on to the north
chain_ret:
        li      r5, 1
        beq     r13, r5, mean_done
        jmp     r_done

        .task T_START, start
