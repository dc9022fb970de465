"""kernels.sm90.sass.steady_state_loops on synthetic nvdisasm text: the innermost backward-branch loops that hold
HGMMA and MUFU.EX2 and no EXIT, in address order (CPU, no compile)."""
from kernels.sm90.sass import steady_state_loops


def _sass(lines):
    out, a = [], 0
    for x in lines:
        if x.endswith(":"):
            out.append(x)
        else:
            out.append(f"        /*{a:04x}*/                   {x} ;")
            a += 16
    return "\n".join(out)


SASS = _sass([
    "MOV R1, c[0x0][0x28]",
    ".L_x_1:",                      # outer loop: holds the inner one, so not counted
    "IADD3 R2, R2, 0x1, RZ",
    ".L_x_2:",                      # inner loop 1: HGMMA + MUFU.EX2
    "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT",
    "MUFU.EX2 R3, R4",
    "FFMA R5, R3, R6, R7",
    "@P0 BRA `(.L_x_2)",
    "@P1 BRA `(.L_x_1)",
    ".L_x_3:",                      # a loop without MUFU.EX2: not an attention main loop
    "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT",
    "@P0 BRA `(.L_x_3)",
    ".L_x_4:",                      # inner loop 2
    "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT",
    "MUFU.EX2 R3, R4",
    "@P0 BRA `(.L_x_4)",
    "EXIT",
    ".L_x_5:",                      # a retry block past EXIT that branches back: holds EXIT-free ops but no HGMMA
    "SYNCS.PHASECHK.TRANS64 P0, [UR4], R0",
    "@!P0 BRA `(.L_x_5)",
])


def test_inner_attention_loops_only_in_address_order():
    loops = steady_state_loops(SASS)
    assert [[op for op, _ in body] for body in loops] == [
        ["HGMMA.64x128x16.F32.BF16", "MUFU.EX2", "FFMA", "BRA"],
        ["HGMMA.64x64x16.F32.BF16", "MUFU.EX2", "BRA"],
    ]


def test_no_loop_without_both_hgmma_and_ex2():
    assert steady_state_loops(_sass(["HGMMA.64x128x16.F32.BF16 R1, gdesc[UR4], RZ, !UPT", "MUFU.EX2 R3, R4"])) == []


def test_loads_before_first_wgmma_wait():
    """LDS.64 counted only between the first HGMMA and the first WARPGROUP.DEPBAR after it."""
    from kernels.sm90.sass import loads_before_first_wgmma_wait

    sass = _sass([
        "LDS.64 R8, [R2]",                                        # before any wgmma: not counted
        "HGMMA.64x80x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT",
        "LDS.64 R10, [R2+0x8]",
        "LDS.128 R12, [R2+0x10]",                                 # another width: not counted
        "LDS.64 R16, [R2+0x20]",
        "WARPGROUP.DEPBAR.LE gsb0, 0x1",
        "LDS.64 R18, [R2+0x28]",                                  # after the wait
    ])
    assert loads_before_first_wgmma_wait(sass) == 2
    assert loads_before_first_wgmma_wait(sass, "LDS.128") == 1


def test_loop_common_paths_take_the_cheaper_side_of_each_guarded_branch():
    """The shortest head-to-back-edge path: a guarded BRA over a rare arm is taken, an unguarded one always, an inner
    retry loop (backward branch) is not; a second loop is measured on its own."""
    from kernels.sm90.sass import loop_common_paths

    sass = _sass([
        ".L_x_1:",
        "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT",   # 1
        ".L_x_9:",
        "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R0",          # 2
        "@!P0 BRA `(.L_x_9)",                                   # 3 (a retry: backward, not taken)
        "MUFU.EX2 R3, R4",                                      # 4
        "@P1 BRA `(.L_x_2)",                                    # 5: skips the three-instruction arm
        "FMUL R5, R5, R6",
        "FMUL R7, R7, R6",
        "FMUL R8, R8, R6",
        ".L_x_2:",
        "@P2 BRA `(.L_x_6)",                                    # 6: its jump leads to the longer arm: falls through
        "BRA `(.L_x_3)",                                        # 7: unguarded, over that arm
        ".L_x_6:",
        "FADD R1, R1, R2",
        "FADD R1, R1, R2",
        "FADD R1, R1, R2",
        "FADD R1, R1, R2",
        ".L_x_3:",
        "FFMA R5, R3, R6, R7",                                  # 8
        "@P0 BRA `(.L_x_1)",                                    # 9: the back edge
        ".L_x_5:",
        "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT",
        "MUFU.EX2 R3, R4",
        "BRA `(.L_x_5)",
        "EXIT",
    ])
    assert loop_common_paths(sass) == [9, 3]
