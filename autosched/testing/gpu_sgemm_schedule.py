"""The hand-written float32 SGEMM schedule (shared-memory tiles, register tiles, vector loads).

``sgemm_schedule(M, N, K, ...)`` returns ``(s, [A, B, C])`` for C = A @ B with A (M, K) and
B (K, N) row-major. Each block computes a ``tile`` x ``tile`` block of C from ``bk``-deep slices
of A and B staged in shared memory; each of its ``(tile/reg)^2`` threads accumulates a ``reg`` x
``reg`` register tile. A is read through a transposed view (AT, inlined) so that its shared
copy is laid out k-major and a thread's column of A is one float4 read from shared memory.

Example::

    s, args = sgemm_schedule(4096, 4096, 4096)
    mod = aus.build(s, args, target="cuda")
"""

from __future__ import annotations

from autosched import te


def sgemm_schedule(M: int, N: int, K: int, tile: int = 128, reg: int = 8, bk: int = 8):
    A = te.placeholder((M, K), name="A")
    B = te.placeholder((K, N), name="B")
    AT = te.compute((K, M), lambda k, m: A[m, k], name="AT")
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((M, N), lambda i, j: te.sum(AT[k, i] * B[k, j], axis=k), name="C")
    s = te.create_schedule(C.op)
    s[AT].compute_inline()
    CL = s.cache_write(C, "local")
    AS = s.cache_read(AT, "shared", [CL])
    BS = s.cache_read(B, "shared", [CL])
    local_copies = False  # cache_read of a cache_read is not resolved by lowering yet
    if local_copies:
        AL = s.cache_read(AS, "local", [CL])
        BL = s.cache_read(BS, "local", [CL])
    threads = tile // reg  # per dimension

    i, j = s[C].op.axis
    by, yi = s[C].split(i, factor=tile)
    bx, xi = s[C].split(j, factor=tile)
    ty, ii = s[C].split(yi, factor=reg)
    tx, jj = s[C].split(xi, factor=reg)
    jo, jv = s[C].split(jj, factor=4)
    s[C].reorder(by, bx, ty, tx, ii, jo, jv)
    s[C].bind(by, te.thread_axis("blockIdx.y"))
    s[C].bind(bx, te.thread_axis("blockIdx.x"))
    s[C].bind(ty, te.thread_axis("threadIdx.y"))
    s[C].bind(tx, te.thread_axis("threadIdx.x"))
    s[C].vectorize(jv)

    s[CL].compute_at(s[C], tx)
    ci, cj = s[CL].op.axis
    (kr,) = s[CL].op.reduce_axis
    ko, ki = s[CL].split(kr, factor=bk)
    s[CL].reorder(ko, ki, ci, cj)
    s[CL].unroll(ki)
    s[CL].unroll(ci)
    s[CL].unroll(cj)

    s[AS].compute_at(s[CL], ko)
    s[BS].compute_at(s[CL], ko)
    if local_copies:
        s[AL].compute_at(s[CL], ki)
        s[BL].compute_at(s[CL], ki)
        for X in (AL, BL):
            _, a1 = s[X].op.axis
            ao, av = s[X].split(a1, factor=4)
            s[X].vectorize(av)

    # A tile (bk x tile in AS, read from rows of A): each thread loads 4 consecutive k of one
    # row m with one float4 (scattered into AS's k-major layout).
    ak, am = s[AS].op.axis
    s[AS].reorder(am, ak)
    akq, akv = s[AS].split(ak, factor=4)
    f = s[AS].fuse(am, akq)
    fy, fx = s[AS].split(f, factor=threads)
    fyo, fyi = s[AS].split(fy, factor=threads)
    s[AS].reorder(fyo, fyi, fx, akv)
    s[AS].bind(fyi, te.thread_axis("threadIdx.y"))
    s[AS].bind(fx, te.thread_axis("threadIdx.x"))
    s[AS].vectorize(akv)

    # B tile (bk x tile): float4 loads and stores along n.
    bk_, bn = s[BS].op.axis
    bnq, bnv = s[BS].split(bn, factor=4)
    f = s[BS].fuse(bk_, bnq)
    fy, fx = s[BS].split(f, factor=threads)
    fyo, fyi = s[BS].split(fy, factor=threads)
    s[BS].reorder(fyo, fyi, fx, bnv)
    s[BS].bind(fyi, te.thread_axis("threadIdx.y"))
    s[BS].bind(fx, te.thread_axis("threadIdx.x"))
    s[BS].vectorize(bnv)
    return s, [A, B, C]
