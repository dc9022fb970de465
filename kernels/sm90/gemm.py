"""One wgmma chain helper shared by the sm90 forward and backward kernels."""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import const_expr
from cutlass.cute.nvgpu import warpgroup


@cute.jit
def wgmma(tiled_mma: cute.TiledMma, acc: cute.Tensor, tA: cute.Tensor, tB: cute.Tensor,
          zero_init: cutlass.Constexpr[bool], fence: cutlass.Constexpr[bool] = True,
          commit: cutlass.Constexpr[bool] = True):
    """acc (+)= tA tB over every k-block, issued asynchronously on a fresh atom of ``tiled_mma`` (the tiled MMA's
    own accumulate flag is never touched). ``fence``: wgmma.fence first (needed when registers the chain reads
    were written since the last fence); ``commit``: close the chain as one wgmma group; the caller waits."""
    if const_expr(fence):
        warpgroup.fence()
    atom = cute.make_mma_atom(tiled_mma.op)
    atom.set(warpgroup.Field.ACCUMULATE, not zero_init)
    for k in cutlass.range_constexpr(cute.size(tA.shape[2])):
        cute.gemm(atom, acc, tA[None, None, k], tB[None, None, k], acc)
        atom.set(warpgroup.Field.ACCUMULATE, True)
    if const_expr(commit):
        warpgroup.commit_group()
