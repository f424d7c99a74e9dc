; relayout: move words between PEs over the fabric, as a table of moves
; (docs/transformer.md section 11). The host plans the moves
; (firmware/kernels/relayout.py): every word has a source (PE, address) and a
; destination (PE, address); the words travel along the mesh rows first
; (a chain east and a chain west), then along the columns (a chain south and
; a chain north), each line stage its own program run, and each PE executes
; its part of a stage as a list of raw copies:
;
;   send      memory (base, stride)  -> the chain's outgoing color
;   keep      the chain's incoming color -> memory (base, stride)
;   forward   the incoming color -> the outgoing color
;   local     memory -> memory (words that stay on their PE)
;
; Each table entry is two descriptors (source, destination: four words in
; the .dsd format), and one `fmov` runs it: a word per cycle, the vector
; engine waiting on the fabric where it must. No float operation: fmov is a
; raw 32-bit copy, so the bits arrive unchanged.
;
; `p_n` entries start at `p_tab`.

        .equ T_START, 0

        .data
p_n:      .word 0               ; entries of this PE's table
p_tab:    .word 0               ; address of the table

        .text
start:
        ld      r3, p_n(r0)
        beq     r3, r0, done            ; nothing to move here
        ld      r4, p_tab(r0)
move:
        ldsd    d1, 0(r4)               ; the source
        ldsd    d2, 2(r4)               ; the destination
        fmov    d2, d1
        addi    r4, r4, 4
        addi    r3, r3, -1
        bne     r3, r0, move
done:
        exit

        .task T_START, start
