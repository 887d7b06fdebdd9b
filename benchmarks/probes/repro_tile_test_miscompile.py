"""A standalone repro of the tile-test miscompile seen on an H200 with Triton 3.6 (NOTES.md, 2026-11-23).

    python benchmarks/probes/repro_tile_test_miscompile.py

The kernel is the tile classification fxflash printed for neighbourhood_2d (width 6,
radius 1) when intervals.RULES had a rule for ``%`` (since removed): for one row tile
[m_lo, m_hi] it classifies a chunk of key tiles by interval arithmetic and stores
``lo_t`` (the first key tile that may hold a kept score). For rows 0..18 and keys 0..36 the
one key tile holds kept scores, so ``lo_t`` must be 0; with ``FULL`` set the H200 returned 1
(every tile empty) inside fxflash's kernel. Prints what the GPU (or the interpreter, with
TRITON_INTERPRET=1) computes for FULL = 0 and 1.
"""
import torch
import triton
import triton.language as tl


@triton.jit
def classify(out_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FULL: tl.constexpr):
    m_lo = tl.program_id(0) * BLOCK_M
    m_hi = tl.minimum(m_lo + BLOCK_M, M) - 1
    iv1 = ((m_lo - (((m_lo % 6) + 6) % 6)) // 6)
    iv2 = ((m_hi - (((m_hi % 6) + 6) % 6)) // 6)
    iv11 = tl.minimum(iv2 - iv1, 1)
    iv12 = (((m_lo % 6) + 6) % 6) * (1 - iv11)
    iv13 = (((m_hi % 6) + 6) % 6) + (5 - (((m_hi % 6) + 6) % 6)) * iv11
    n_tiles = tl.cdiv(N, BLOCK_N).to(tl.int32)
    lo_t = n_tiles
    n_full = n_tiles * 0
    for c0 in range(0, n_tiles, 128):
        t = c0 + tl.arange(0, 128)
        n_lo = t * BLOCK_N
        n_hi = tl.minimum(n_lo + BLOCK_N, N) - 1
        iv3 = ((n_lo - (((n_lo % 6) + 6) % 6)) // 6)
        iv4 = ((n_hi - (((n_hi % 6) + 6) % 6)) // 6)
        iv5 = iv1 - iv4
        iv6 = iv2 - iv3
        iv7 = tl.maximum(tl.maximum(iv5, -iv6), 0)
        iv8 = tl.maximum(iv6, -iv5)
        iv9 = iv8 <= 1
        iv10 = iv7 <= 1
        iv14 = tl.minimum(iv4 - iv3, 1)
        iv15 = (((n_lo % 6) + 6) % 6) * (1 - iv14)
        iv16 = (((n_hi % 6) + 6) % 6) + (5 - (((n_hi % 6) + 6) % 6)) * iv14
        iv17 = iv12 - iv16
        iv18 = iv13 - iv15
        iv19 = tl.maximum(tl.maximum(iv17, -iv18), 0)
        iv20 = tl.maximum(iv18, -iv17)
        iv21 = iv20 <= 1
        iv22 = iv19 <= 1
        iv23 = iv9 & iv21
        iv24 = iv10 & iv22
        live = (t < n_tiles) & iv24
        lo_t = tl.minimum(lo_t, tl.min(tl.where(live, t, n_tiles), 0))
        if FULL:
            full = live & (t < N // BLOCK_N) & iv23
            n_full += tl.sum(full.to(tl.int32), 0)
    tl.store(out_ptr + tl.program_id(0) * 2, lo_t)
    tl.store(out_ptr + tl.program_id(0) * 2 + 1, n_full)


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for full in (0, 1):
        out = torch.full((2,), -1, dtype=torch.int32, device=device)
        classify[(1,)](out, 19, 37, BLOCK_M=64, BLOCK_N=64, FULL=full, num_warps=4)
        lo_t, n_full = out.tolist()
        print(f"FULL={full}: lo_t={lo_t} (expected 0), full tiles={n_full} (expected 0)"
              + ("" if (lo_t, n_full) == (0, 0) else "  <-- WRONG"))


if __name__ == "__main__":
    main()
