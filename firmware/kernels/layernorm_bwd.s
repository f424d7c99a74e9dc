; layernorm_bwd: LayerNorm backward over the features of every token, in the
; order of firmware/training/transformer.py's layernorm_backward
; (docs/transformer.md sections 3.2 and 9).
;
; The forward's layout: feature k on mesh row k mod H, the tokens dealt over
; the columns; PE (x, y) holds `p_f` features times `p_t` tokens, feature-major
; (the t tokens of one feature contiguous): dy in DY, the forward's xhat in XH,
; the forward's r (one per token, as the forward leaves it on every PE of
; the column) in R, its features' gamma in GAM.
;
;   g = mul(dy, gamma)  (per feature)            -> G
;   gx = mul(g, xhat)                            -> GX
;   P = [+0 + g[f0] + g[f1] + ..., +0 + gx[f0] + ...]   (2t: both feature sums at once)
;   down the column, a chain: S = P (row 0); S = add(S from the north, P)
;   the south PE: [a, c] = mul(S, 1/D), sent back north, every PE keeping a copy
;   dx = mul(sub(sub(g, a), mul(xhat, c)), r)    -> DX
;   dgamma, dbeta: per feature GD = [+0 + mul(dy, xhat)[t0] + ..., +0 + dy[t0] + ...]
;   (the PE's tokens in order), then a chain east along the mesh row:
;   RUN = +0 (column 0) or the row vector from the west; RUN = add(RUN, GD);
;   the last column holds [dgamma, dbeta] of the row's features.
;
; Registers: r3 = f, r4 = t, r12 = f*t, r2 = 2t, r11 = 2f.

        .equ T_START, 0

        .data
p_f:      .word 0               ; features held here
p_t:      .word 0               ; tokens held here
p_invd:   .word 0               ; binary32 1/D
p_first:  .word 0               ; 1 in row 0
p_last:   .word 0               ; 1 in the south row
p_cin:    .word 0               ; the column chain: from the north ..
p_cout:   .word 0               ; .. on to the south
p_bin:    .word 0               ; [a, c] from the south ..
p_bout:   .word 0               ; .. on to the north
p_west:   .word 0               ; 1 in column 0 (the row chain starts at +0)
p_east:   .word 0               ; 1 in the last column with tokens (it holds dgamma, dbeta)
p_rin:    .word 0               ; the row chain: from the west ..
p_rout:   .word 0               ; .. on to the east
p_dy:     .word 0               ; buffer addresses
p_xh:     .word 0
p_g:      .word 0
p_gx:     .word 0
p_dx:     .word 0
p_p:      .word 0
p_s:      .word 0
p_rr:     .word 0
p_gam:    .word 0
p_gd:     .word 0
p_run:    .word 0
t_mem:    .dsd mem, base=0, len=0, stride=1
t_k:      .dsd mem, base=0, len=0, stride=0
t_in:     .dsd fabin, color=0, len=0
t_out:    .dsd fabout, color=0, len=0
k_zero:   .word 0

        .text
start:
        ld      r4, p_t(r0)
        beq     r4, r0, done            ; no tokens in this column
        ld      r3, p_f(r0)
        mul     r12, r3, r4
        add     r2, r4, r4
        add     r11, r3, r3
        ldsd    d1, t_mem(r0)           ; d1, d2, d3: a feature's tokens in three buffers
        setl    d1, r4
        ldsd    d2, t_mem(r0)
        setl    d2, r4
        ldsd    d3, t_mem(r0)
        setl    d3, r4
        ld      r5, p_dy(r0)
        setb    d1, r5
        ld      r5, p_g(r0)
        setb    d2, r5
        ld      r6, p_gam(r0)
        add     r8, r3, r0
        beq     r8, r0, g_done
g_loop:                                 ; g = mul(dy, gamma), feature by feature
        ld      r5, 0(r6)
        fmuls   d2, d1, r5
        addb    d1, r4
        addb    d2, r4
        addi    r6, r6, 1
        addi    r8, r8, -1
        bne     r8, r0, g_loop
g_done:
        ldsd    d4, t_mem(r0)           ; GX = mul(g, xhat), all at once
        ld      r5, p_gx(r0)
        setb    d4, r5
        setl    d4, r12
        ldsd    d5, t_mem(r0)
        ld      r5, p_g(r0)
        setb    d5, r5
        setl    d5, r12
        ldsd    d6, t_mem(r0)
        ld      r5, p_xh(r0)
        setb    d6, r5
        setl    d6, r12
        fmul    d4, d5, d6
        ldsd    d0, t_mem(r0)           ; P = +0 (2t)
        ld      r5, p_p(r0)
        setb    d0, r5
        setl    d0, r2
        ldsd    d7, t_k(r0)
        li      r5, k_zero
        setb    d7, r5
        fmov    d0, d7
        setl    d0, r4                  ; P[0..t) += g[f], P[t..2t) += gx[f], features in order
        ldsd    d5, t_mem(r0)
        ld      r5, p_p(r0)
        add     r5, r5, r4
        setb    d5, r5
        setl    d5, r4
        ld      r5, p_g(r0)
        setb    d1, r5
        ld      r5, p_gx(r0)
        setb    d2, r5
        add     r8, r3, r0
        beq     r8, r0, psum_done
psum_loop:
        fadd    d0, d0, d1
        fadd    d5, d5, d2
        addb    d1, r4
        addb    d2, r4
        addi    r8, r8, -1
        bne     r8, r0, psum_loop
psum_done:
        setl    d0, r2
; the column chain south of P (2t) and back north of [a, c]; S (d6) gets them
        ldsd    d6, t_mem(r0)
        ld      r5, p_s(r0)
        setb    d6, r5
        setl    d6, r2
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
        setl    d4, r2
        fadd    d4, d3, d0              ; add(S from the north, P), on to the south
        jmp     chain_back
chain_fold_last:
        fadd    d6, d3, d0              ; the column's sums
        jmp     chain_finish
chain_first:
        bne     r10, r0, chain_alone
        ldsd    d4, t_out(r0)
        ld      r5, p_cout(r0)
        setb    d4, r5
        setl    d4, r2
        fmov    d4, d0                  ; S = P, on to the south
        jmp     chain_back
chain_alone:
        fmov    d6, d0                  ; one row: S = P
chain_finish:                           ; the south PE: [a, c] = mul(S, 1/D)
        ld      r5, p_invd(r0)
        fmuls   d6, d6, r5
        bne     r9, r0, dx_start        ; one row
        ldsd    d4, t_out(r0)
        ld      r5, p_bout(r0)
        setb    d4, r5
        setl    d4, r2
        fmov    d4, d6                  ; back north
        jmp     dx_start
chain_back:
        ldsd    d3, t_in(r0)
        ld      r5, p_bin(r0)
        setb    d3, r5
        fmov    d6, d3                  ; [a, c], from the south
        bne     r9, r0, dx_start        ; row 0: nobody further north
        ldsd    d4, t_out(r0)
        ld      r5, p_bout(r0)
        setb    d4, r5
        setl    d4, r2
        fmov    d4, d6                  ; on to the north
; dx = mul(sub(sub(g, a), mul(xhat, c)), r), feature by feature (G and GX reused)
dx_start:
        setl    d6, r4                  ; d6 = a, d7 = c, d0 = r
        ldsd    d7, t_mem(r0)
        ld      r5, p_s(r0)
        add     r5, r5, r4
        setb    d7, r5
        setl    d7, r4
        ld      r5, p_rr(r0)
        setb    d0, r5
        setl    d0, r4
        ld      r5, p_g(r0)             ; d1 = g, d2 = gx, d3 = xhat, d4 = dx
        setb    d1, r5
        ld      r5, p_gx(r0)
        setb    d2, r5
        ldsd    d3, t_mem(r0)
        ld      r5, p_xh(r0)
        setb    d3, r5
        setl    d3, r4
        ldsd    d4, t_mem(r0)
        ld      r5, p_dx(r0)
        setb    d4, r5
        setl    d4, r4
        add     r8, r3, r0
        beq     r8, r0, dx_done
dx_loop:
        fsub    d1, d1, d6              ; sub(g, a)
        fmul    d2, d3, d7              ; mul(xhat, c)
        fsub    d1, d1, d2
        fmul    d4, d1, d0              ; times r
        addb    d1, r4
        addb    d2, r4
        addb    d3, r4
        addb    d4, r4
        addi    r8, r8, -1
        bne     r8, r0, dx_loop
dx_done:
; GD: per feature the token sums of mul(dy, xhat) and of dy (GX reused for the products)
        ldsd    d4, t_mem(r0)
        ld      r5, p_gx(r0)
        setb    d4, r5
        setl    d4, r12
        ldsd    d5, t_mem(r0)
        ld      r5, p_dy(r0)
        setb    d5, r5
        setl    d5, r12
        ldsd    d6, t_mem(r0)
        ld      r5, p_xh(r0)
        setb    d6, r5
        setl    d6, r12
        fmul    d4, d5, d6
        setl    d4, r4
        setl    d5, r4
        ld      r6, p_gd(r0)
        add     r7, r6, r3
        add     r8, r3, r0
        beq     r8, r0, gd_done
gd_loop:
        li      r5, 0
        fsum    r5, d4                  ; +0 + mul(dy, xhat)[t0] + ...
        st      r5, 0(r6)
        li      r5, 0
        fsum    r5, d5                  ; +0 + dy[t0] + ...
        st      r5, 0(r7)
        addb    d4, r4
        addb    d5, r4
        addi    r6, r6, 1
        addi    r7, r7, 1
        addi    r8, r8, -1
        bne     r8, r0, gd_loop
gd_done:
; the row chain east: RUN = +0 or the row vector from the west; RUN = add(RUN, GD); on east
        ldsd    d0, t_mem(r0)
        ld      r5, p_run(r0)
        setb    d0, r5
        setl    d0, r11
        ld      r5, p_west(r0)
        beq     r5, r0, run_recv
        ldsd    d7, t_k(r0)
        li      r5, k_zero
        setb    d7, r5
        fmov    d0, d7
        jmp     run_add
run_recv:
        ldsd    d7, t_in(r0)
        ld      r5, p_rin(r0)
        setb    d7, r5
        fmov    d0, d7
run_add:
        ldsd    d1, t_mem(r0)
        ld      r5, p_gd(r0)
        setb    d1, r5
        setl    d1, r11
        fadd    d0, d0, d1
        ld      r5, p_east(r0)
        bne     r5, r0, done
        ldsd    d4, t_out(r0)
        ld      r5, p_rout(r0)
        setb    d4, r5
        setl    d4, r11
        fmov    d4, d0
done:
        exit

        .task T_START, start
