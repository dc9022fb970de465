"""The instruction-mix table groups SASS opcodes as documented (spills, exponentials, tensor-core ops)."""
from analysis.instruction_mix import GROUPS, mix, per_emulated_exp

SASS = """
        /*0010*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT ;
        /*0020*/                   MUFU.EX2 R3, R3 ;
        /*0030*/               @P0 MUFU.EX2 R4, R4 ;
        /*0040*/                   FFMA R5, R6, R7, R8 ;
        /*0050*/                   STL [R1+0x4], R9 ;
        /*0060*/                   LDL R9, [R1+0x4] ;
        /*0070*/                   REDG.E.ADD.F32.FTZ.RN.STRONG.GPU desc[UR6][R2.64], R10 ;
        /*0080*/                   F2I.FTZ.TRUNC.NTZ R11, R12 ;
        /*0090*/                   FFMA.SAT R5, R6, R7, R8 ;
        /*00a0*/                   LEA R5, R6, R7, 0x17 ;
"""


def test_groups():
    m = mix(SASS)
    assert set(m) == set(GROUPS) | {"total"} and m["total"] == 10
    # FFMA counts every FFMA (FFMA.SAT included); FFMA.SAT is also its own column
    assert (m["HGMMA"], m["MUFU.EX2"], m["FFMA"], m["LDL(spill)"], m["STL(spill)"]) == (1, 2, 2, 1, 1)
    assert m["FFMA.SAT"] == 1 and m["LEA"] == 1
    assert m["RED/ATOM"] == 1 and m["F2I/FRND"] == 1 and m["FADD"] == 0


def test_per_emulated_exp():
    base = {"MUFU.EX2": 130, "FFMA": 130, "FADD": 134, "FMNMX": 135, "total": 1525}
    row = {"MUFU.EX2": 66, "FFMA": 130 + 64 * 5, "FADD": 134 + 64, "FMNMX": 135, "total": 1525 + 64 * 6 + 3}
    assert per_emulated_exp(row, base) == {"fp_per_emu_exp": 6.0, "insns_per_emu_exp": 6.047}
    assert per_emulated_exp(base, base) == {"fp_per_emu_exp": "", "insns_per_emu_exp": ""}
