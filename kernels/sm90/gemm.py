"""One wgmma chain helper shared by the sm90 forward and backward kernels."""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import const_expr
from cutlass.cute.nvgpu import warpgroup


@cute.jit
def wgmma(tiled_mma: cute.TiledMma, acc: cute.Tensor, tA: cute.Tensor, tB: cute.Tensor,
          zero_init: cutlass.Constexpr[bool], fence: cutlass.Constexpr[bool] = True,
          commit: cutlass.Constexpr[bool] = True, k_from: cutlass.Constexpr[int] = 0):
    """acc (+)= tA tB over the k-blocks of tA from ``k_from`` on, issued asynchronously on a fresh atom of
    ``tiled_mma`` (the tiled MMA's own accumulate flag is never touched). ``fence``: wgmma.fence first (needed when
    registers the chain reads were written since the last fence); ``commit``: close the chain as one wgmma group; the
    caller waits."""
    if const_expr(fence):
        warpgroup.fence()
    atom = cute.make_mma_atom(tiled_mma.op)
    atom.set(warpgroup.Field.ACCUMULATE, not zero_init)
    for k in cutlass.range_constexpr(k_from, cute.size(tA.shape[2])):
        cute.gemm(atom, acc, tA[None, None, k], tB[None, None, k], acc)
        atom.set(warpgroup.Field.ACCUMULATE, True)
    if const_expr(commit):
        warpgroup.commit_group()


@cute.jit
def wgmma_split_a(rs_mma: cute.TiledMma, ss_mma: cute.TiledMma, acc: cute.Tensor, tA_regs: cute.Tensor,
                  tA_smem: cute.Tensor, tB: cute.Tensor, zero_init: cutlass.Constexpr[bool]):
    """acc (+)= A B as one wgmma group whose first k-blocks take A from registers (``tA_regs``: its k-blocks, on
    ``rs_mma``'s atom) and the rest from shared memory (``tA_smem``: every k-block's descriptor, the ones past
    tA_regs used, on ``ss_mma``'s atom); B (``tB``) from shared memory throughout."""
    wgmma(rs_mma, acc, tA_regs, tB, zero_init, commit=False)
    wgmma(ss_mma, acc, tA_smem, tB, False, fence=False, k_from=cute.size(tA_regs.shape[2]))
