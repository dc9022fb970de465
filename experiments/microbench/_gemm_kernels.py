"""Triton kernel of the GEMM microbenchmark (see gemm_bench.py): C = A @ B^T, bf16 in, fp32 accumulate.
On sm_90a Triton lowers ``tl.dot`` with 2 warpgroups (num_warps=8) to wgmma (HGMMA in SASS)."""
import triton
import triton.language as tl


@triton.jit
def matmul_kernel(A, B, C, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):
    pid = tl.program_id(0)
    n_m = tl.cdiv(M, BM)
    n_n = tl.cdiv(N, BN)
    group = pid // (GROUP * n_n)  # grouped ordering so consecutive programs share A/B tiles in L2
    first_m = group * GROUP
    size = tl.minimum(n_m - first_m, GROUP)
    pm = first_m + (pid % (GROUP * n_n)) % size
    pn = (pid % (GROUP * n_n)) // size
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a_ptr = A + rm[:, None] * K + rk[None, :]
    b_ptr = B + rn[:, None] * K + rk[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(0, tl.cdiv(K, BK)):
        a = tl.load(a_ptr)
        b = tl.load(b_ptr)
        acc = tl.dot(a, tl.trans(b), acc)
        a_ptr += BK
        b_ptr += BK
    tl.store(C + rm[:, None] * N + rn[None, :], acc.to(tl.bfloat16))
