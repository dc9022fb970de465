"""SASS of a compiled sm90 kernel: disassemble its cubin (nvdisasm) and count opcodes.

Used by the SASS structure tests and to explain measurements with the instruction mix
(HGMMA, MUFU.EX2 vs FFMA, spills as LDL/STL, F2I/FRND on the MUFU pipe, VOTE for the tau decision).
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from collections import Counter


def find_nvdisasm() -> str | None:
    exe = shutil.which("nvdisasm")
    if exe:
        return exe
    try:
        import nvidia

        for root in nvidia.__path__:
            hits = glob.glob(os.path.join(root, "**", "bin", "nvdisasm"), recursive=True)
            if hits:
                return hits[0]
    except ImportError:
        pass
    return None


def disassemble(cubin_path: str) -> str:
    exe = find_nvdisasm()
    if exe is None:
        raise RuntimeError("nvdisasm not found: pip install nvidia-cuda-nvdisasm")
    return subprocess.run([exe, "-c", cubin_path], check=True, capture_output=True, text=True).stdout


_INSN = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)")


_INSN_FULL = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)([^;]*);")
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")


def _parse(sass: str) -> tuple[list[tuple[int, str, str, str]], dict[str, int]]:
    """[(address, guard predicate or '', opcode, operands)] of nvdisasm text, and each label's address."""
    out, labels, pending = [], {}, []
    for line in sass.splitlines():
        lm = _LABEL.match(line)
        if lm:
            pending.append(lm.group(1))
            continue
        m = _INSN_FULL.search(line)
        if m:
            a = int(m.group(1), 16)
            labels.update((lab, a) for lab in pending)
            pending = []
            out.append((a, (m.group(2) or "").strip(), m.group(3), m.group(4)))
    return out, labels


def instructions(sass: str) -> tuple[list[tuple[int, str, str]], dict[str, int]]:
    """The instructions of nvdisasm text as [(address, opcode, operands)], and each label's address."""
    ins, labels = _parse(sass)
    return [(a, op, rest) for a, _, op, rest in ins], labels


def _loop_spans(ins, labels) -> list[tuple[int, int]]:
    """(head, back-edge branch) addresses of the innermost loops that hold HGMMA and MUFU.EX2 and whose back edge
    precedes the last EXIT (the out-of-line mbarrier retry blocks sit past it and branch back into the loops; an EXIT
    inside a loop's range is ptxas placing another block's code there, as in the persistent split-tail kernel)."""
    last_exit = max((a for a, op, _ in ins if op == "EXIT"), default=None)
    spans = []
    for a, op, rest in ins:
        m = re.search(r"(\.L_x_\d+)", rest) if op.startswith("BRA") else None
        if m and labels[m.group(1)] < a and (last_exit is None or a < last_exit):
            ops = [o for x, o, _ in ins if labels[m.group(1)] <= x <= a]
            if any(o.startswith("HGMMA") for o in ops) and "MUFU.EX2" in ops:
                spans.append((labels[m.group(1)], a))
    return sorted(s for s in spans if not any(t != s and s[0] <= t[0] and t[1] <= s[1] for t in spans))


def steady_state_loops(sass: str) -> list[list[tuple[str, str]]]:
    """Bodies [(opcode, operands)] of the innermost loops (backward branches) that hold HGMMA and MUFU.EX2 (_loop_spans):
    the attention main loops, one K/V block per iteration (the out-of-line mbarrier retry blocks sit past the last EXIT
    and branch back into the loops, so they are not counted as loops of their own)."""
    ins, labels = instructions(sass)
    return [[(o, r) for x, o, r in ins if head <= x <= tail] for head, tail in _loop_spans(ins, labels)]


def loop_common_paths(sass: str) -> list[int]:
    """Per steady-state loop (as steady_state_loops), the instructions on its shortest path from the head to the
    back-edge branch: what one iteration issues when every guarded branch takes its cheaper side -- the loop's common
    path where the rare arms (the rescale, speculative_exp's second QK^T, the mbarrier retries, which sit out of line)
    are the longer ones. Forward edges only: a guarded BRA falls through or jumps, an unguarded one jumps; inner
    backward branches (retry loops) are not taken."""
    return [len(p) for p in loop_common_path_ops(sass)]


def loop_common_path_ops(sass: str) -> list[list[tuple[str, str]]]:
    """Per steady-state loop, the instructions [(opcode, operands)] of its common path (loop_common_paths), in order
    (the first of the shortest paths)."""
    parsed, labels = _parse(sass)
    ins = [(a, op, rest) for a, _, op, rest in parsed]
    out = []
    for head, tail in _loop_spans(ins, labels):
        body = [x for x in parsed if head <= x[0] <= tail]
        pos = {a: i for i, (a, *_) in enumerate(body)}
        dist, prev = [None] * len(body), [None] * len(body)
        dist[0] = 1
        for i, (a, guard, op, rest) in enumerate(body[:-1]):
            if dist[i] is None:
                continue
            succ = []
            m = re.search(r"(\.L_x_\d+)", rest) if op.startswith("BRA") else None
            if m is None or guard not in ("", "@PT"):
                succ.append(i + 1)
            if m is not None and labels[m.group(1)] in pos and pos[labels[m.group(1)]] > i:
                succ.append(pos[labels[m.group(1)]])
            for j in succ:
                if dist[j] is None or dist[i] + 1 < dist[j]:
                    dist[j], prev[j] = dist[i] + 1, i
        path = [len(body) - 1]
        while prev[path[-1]] is not None:
            path.append(prev[path[-1]])
        out.append([(body[i][2], body[i][3]) for i in reversed(path)])
    return out


def loads_before_first_wgmma_wait(sass: str, opcode: str = "LDS.64") -> int:
    """Instructions ``opcode`` between the first kernel function's first HGMMA and the first WARPGROUP.DEPBAR after it:
    shared-memory loads issued while the first wgmma runs (the backward's LSE preload), not after its wait."""
    seq = [op for _, op, _ in instructions(sass)[0]]
    h = next(i for i, op in enumerate(seq) if op.startswith("HGMMA"))
    w = next(i for i in range(h, len(seq)) if seq[i].startswith("WARPGROUP.DEPBAR"))
    return sum(op.startswith(opcode) for op in seq[h:w])


def opcode_counts(sass: str) -> Counter:
    """Counter of full opcodes (with modifiers, e.g. 'MUFU.EX2', 'HGMMA.64x128x16.F32.BF16')."""
    return Counter(m.group(1) for m in _INSN.finditer(sass))


def count(counts: Counter, prefix: str) -> int:
    """Instructions whose opcode is ``prefix`` or starts with ``prefix.``."""
    return sum(n for op, n in counts.items() if op == prefix or op.startswith(prefix + "."))


def kernel_sass(kern, workdir: str) -> str | None:
    """Compile a forward kernel object (kernels.sm90.compile.make_fwd_kernel) into ``workdir`` and return the SASS
    of its one cubin; None when nvdisasm is missing (the compile still ran, so compile-only checks hold)."""
    from .compile import compile_fwd

    os.makedirs(workdir, exist_ok=True)
    if compile_fwd(kern, tvm_ffi=False, dump_dir=workdir) is None:
        raise RuntimeError("compile_fwd returned nothing")
    if find_nvdisasm() is None:
        return None
    cubins = sorted(glob.glob(os.path.join(workdir, "*.cubin")))
    if len(cubins) != 1:
        raise RuntimeError(f"expected one cubin in {workdir}, found {len(cubins)}")
    return disassemble(cubins[0])


def fwd_sass(cfg, dtype: str, hdim: int, hdim_v: int, causal: bool, workdir: str) -> str:
    """Compile the forward kernel for a resolved config into ``workdir`` and return its SASS text."""
    from .compile import make_fwd_kernel

    sass = kernel_sass(make_fwd_kernel(cfg, dtype, hdim, hdim_v, causal), workdir)
    if sass is None:
        raise RuntimeError("nvdisasm not found: pip install nvidia-cuda-nvdisasm")
    return sass
