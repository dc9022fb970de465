"""Register-layout views of Hopper wgmma accumulators used by the sm90 kernels.

A wgmma m64nN fp32 accumulator fragment has layout ((2, 2, N/8), MMA_M, MMA_N): per thread, value pairs of
adjacent columns (mode 0), two rows 8 apart (mode 1), N/8 column chunks of 8 (mode 2).
  ``acc_rows_cols(t)`` -> the same registers viewed as ((2, MMA_M), (2, N/8, MMA_N)) = (rows, cols)
  ``acc_as_a_operand(t)`` -> the registers viewed as the A operand of a following RS wgmma (16-bit)
  ``quad_transpose(...)`` -> a quad's 4 x 4 column-pair words transposed across its lanes (16-byte O stores)
"""
from __future__ import annotations

import cutlass.cute as cute
from cutlass import Uint32, select_


def _rows_cols_layout(acc_layout):
    cm = cute.make_layout(acc_layout.shape)  # column-major over the fragment's logical shape
    if len(cm.shape[0]) == 2:  # an m64n8 accumulator: mode 0 is (2, 2), one column chunk
        shape = ((cm.shape[0][1], cm.shape[1]), (cm.shape[0][0], cm.shape[2]))
        stride = ((cm.stride[0][1], cm.stride[1]), (cm.stride[0][0], cm.stride[2]))
        return cute.composition(acc_layout, cute.make_layout(shape, stride=stride))
    shape = ((cm.shape[0][1], cm.shape[1]), (cm.shape[0][0], cm.shape[0][2], cm.shape[2]))
    stride = ((cm.stride[0][1], cm.stride[1]), (cm.stride[0][0], cm.stride[0][2], cm.stride[2]))
    return cute.composition(acc_layout, cute.make_layout(shape, stride=stride))


def acc_rows_cols(acc):
    """View a wgmma accumulator (or its coordinate tensor) as (rows, cols) per thread."""
    return cute.make_tensor(acc.iterator, _rows_cols_layout(acc.layout))


def acc_as_a_operand(acc):
    """((2, 2, N/8), M, N) -> ((2, 2, 2), M, (N/16, N)): the register A fragment of an RS wgmma (k16 atoms)."""
    lay = acc.layout
    l = cute.logical_divide(lay, ((None, None, 2), None, None))
    frag = cute.make_layout(
        ((l.shape[0][0], l.shape[0][1], l.shape[0][2][0]), l.shape[1], (l.shape[0][2][1], l.shape[2])),
        stride=((l.stride[0][0], l.stride[0][1], l.stride[0][2][0]), l.stride[1], (l.stride[0][2][1], l.stride[2])),
    )
    return cute.make_tensor(acc.iterator, frag)



def _dsl_pick(cond, a, b):
    """A 32-bit select in the kernel: ``a`` where ``cond`` holds, else ``b``."""
    return Uint32(select_(cond, a, b))


def rotate_by_lane(words, odd, high, sign: int, pick=_dsl_pick):
    """4 register words rotated by a lane-dependent amount q = 2 * high + odd (``odd`` / ``high``: the lane's bits):
    sign 1 -> out[k] = words[(k + q) % 4], sign -1 -> out[k] = words[(k - q) % 4]; two rounds of 4 selects."""
    out = list(words)
    for bit, step in ((odd, 1), (high, 2)):
        out = [pick(bit, out[(k + sign * step) % 4], out[k]) for k in range(4)]
    return out


def quad_transpose(words, q, odd, high, shuffle, pick=_dsl_pick):
    """The 4 x 4 transpose of 32-bit words across the 4 lanes of a quad (FlashFwdSm90.store_o_wide): lane q holds
    ``words[b]`` = its word of column block b and returns the 4 lanes' words of block q, in lane order. Rotated by q,
    word k goes to lane (q + k) % 4, so each lane reads its word k from lane (q - k) % 4 -- ``shuffle(value, src, k)``
    returns lane ``src``'s ``value`` (k: which word; 3 shuffles) -- and the words read are put back in lane order.
    ``pick`` is the select (the kernel's by default; a plain Python one lets the CPU tests run the plan)."""
    a = rotate_by_lane(words, odd, high, 1, pick)
    w = [a[0]] + [shuffle(a[k], (q - k) & 3, k) for k in (1, 2, 3)]
    # w[k] is lane (q - k) % 4's word of block q
    return rotate_by_lane([w[0], w[3], w[2], w[1]], odd, high, -1, pick)
