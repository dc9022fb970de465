"""The one GPU spec table: per-SM rates of H100 SXM, H200, B200 and B300, each with its source, and the dense
tensor-core peak (TFLOP/s) that timing rows report (``peak_tflops``) derived from the same numbers.

Every number carries a ``Source``: where it comes from (datasheet, CUDA programming guide throughput
table, the FA4 paper, a vendor blog) and whether it is read directly or *inferred* (derived from other
published numbers, or assumed unchanged from the previous generation). Per-clock rates are per SM.
The roofline can replace some of these with calibration measurements (see ``analysis.roofline``).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

# Source labels. Short keys so that a table can print them; full text in SOURCES.
SOURCES = {
    "nv-h100-ds": "NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100; SXM: 132 SMs, BF16/FP16 "
                  "Tensor Core 1,979 TFLOPS with sparsity = 989 dense, 3.35 TB/s HBM3); H100 SXM5 final specs (GPU "
                  "boost 1.98 GHz, 132 SMs / 66 TPCs) as reported by prohardver.hu and "
                  "glennklockwood.com/garden/processors/h100 (BF16 matrix 989.4 dense)",
    "nv-h200-ds": "NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200; SXM: same GH100 compute "
                  "as H100 SXM, BF16/FP16 1,979 TFLOPS with sparsity, 141 GB HBM3e, 4.8 TB/s); geektopia.es (H200 "
                  "launch report) quotes a ~1930 MHz max boost; rows record the NVML clock",
    "nv-hopper-wp": "NVIDIA H100 (Hopper) architecture whitepaper: 4 SM sub-partitions, 128 FP32 cores/SM, "
                    "tensor core 2x A100 per SM per clock (A100: 1024 dense FP16 FMA/clk/SM)",
    "cuda-guide": "CUDA C++ Programming Guide, 'Arithmetic Instructions' throughput table (results per clock "
                  "per SM): fp32 add/mul/fma 128; 32-bit int add/shift 64; exp2/rcp/rsqrt (MUFU) 16. The cc 9.0 / "
                  "10.0 columns were not re-read for this project (the stored copies found hold older columns), "
                  "so values sourced only to it are marked inferred",
    "fa4-paper": "Zadouri et al., FlashAttention-4 (arXiv 2603.05451), Sec. 3 'feeds and speeds' of B200: "
                 "8192 dense BF16 FLOPs/clk/SM, 16 exp2/clk/SM (MUFU), 128 B/clk/SM shared memory; "
                 "B200 = 2.25 dense BF16 PFLOP/s",
    "nv-b200-ds": "NVIDIA DGX/HGX B200 datasheet (FP16/BF16 Tensor Core 36 PFLOPS with sparsity per 8 GPUs = 2.25 "
                  "dense PFLOPS per GPU at 1000 W, 8 TB/s HBM3e per GPU); 148 SMs per the hmc-tech.com B200 spec page",
    "nv-b300-ds": "NVIDIA HGX B300 datasheet: FP16/BF16 Tensor Core 36 PFLOPS with sparsity per 8 GPUs (2.25 dense "
                  "PFLOPS per GPU, as glennklockwood.com/garden/processors/B300 tabulates)",
    "nv-bwu-blog": "NVIDIA technical blog 'Inside NVIDIA Blackwell Ultra' (2025): 160 SMs in the full die, "
                   "SFU (MUFU.EX2) throughput doubled over Blackwell for attention (10.7 vs 5 Tera-exp/s), "
                   "8 TB/s HBM3e",
    "anchor-h200": "our H200 anchor run (../shared/anchors): MUFU ex2 4.15 Tera-exp/s = 15.9 exp/clk/SM "
                   "at 132 SMs x 1.98 GHz",
}


@dataclass(frozen=True)
class Source:
    key: str  # one of SOURCES, or "measured"
    inferred: bool = False  # True: derived from other numbers or assumed, not read directly
    note: str = ""

    def label(self) -> str:
        return f"{self.key}{' (inferred)' if self.inferred else ''}"


@dataclass(frozen=True)
class GPU:
    """Per-SM rates of one GPU. Rates are per clock per SM; clock in MHz; HBM in TB/s."""

    name: str
    arch: str  # "sm90" (Hopper) or "sm100" (Blackwell family, incl. B300 = sm_103)
    sms: int
    clock_mhz: float  # the clock at which the dense tensor peak is quoted (see sources)
    mma_flops_per_clk: float  # dense BF16 tensor-core FLOPs (2 per FMA)
    mufu_ex2_per_clk: float  # MUFU.EX2 results
    fma_per_clk: float  # fp32 FFMA/FADD/FMUL results
    alu_per_clk: float  # 32-bit integer add/shift (and, by assumption, FMNMX / F2FP packs)
    issue_per_clk: float  # thread-instructions issued (4 schedulers x 32 lanes)
    smem_bytes_per_clk: float  # shared-memory bandwidth
    hbm_tb_s: float
    sources: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def peak_tflops(self) -> float:
        return self.mma_flops_per_clk * self.sms * self.clock_mhz * 1e6 / 1e12

    def with_values(self, values: dict, source: Source) -> "GPU":
        """A copy with some rates replaced (e.g. by measured ones), their source recorded."""
        unknown = sorted(set(values) - {f.name for f in fields(self)})
        if unknown:
            raise ValueError(f"values={unknown}: not GPU fields")
        srcs = dict(self.sources)
        srcs.update({k: source for k in values})
        return replace(self, sources=srcs, **values)

    def rows(self) -> list[dict]:
        """One dict per field, with its source: for printing the table."""
        out = []
        for f in fields(self):
            if f.name in ("name", "arch", "sources"):
                continue
            src = self.sources.get(f.name)
            v = getattr(self, f.name)
            out.append(dict(gpu=self.name, field=f.name, value=round(v, 1) if isinstance(v, float) else v,
                            source=src.label() if src else "", note=src.note if src else ""))
        return out


_HOPPER_COMMON = dict(
    arch="sm90",
    sms=132,
    clock_mhz=1830.0,
    mma_flops_per_clk=4096.0,
    mufu_ex2_per_clk=16.0,
    fma_per_clk=128.0,
    alu_per_clk=64.0,
    issue_per_clk=128.0,
    smem_bytes_per_clk=128.0,
)


def _hopper_sources(ds_key: str) -> dict:
    return {
        "sms": Source(ds_key),
        "clock_mhz": Source(ds_key, inferred=True,
                            note="989.4e12 / (132 SMs x 4096 FLOP/clk) = 1830 MHz; max boost is 1980 MHz"),
        "mma_flops_per_clk": Source("nv-hopper-wp", inferred=True, note="2 x 1024 FMA x 2 FLOP"),
        "mufu_ex2_per_clk": Source("anchor-h200", inferred=True,
                                   note="measured 15.9/clk at 1.98 GHz, read as 16 (the guide's value)"),
        "fma_per_clk": Source("nv-hopper-wp", note="128 FP32 cores per SM"),
        "alu_per_clk": Source("cuda-guide", inferred=True,
                              note="int add/shift 64; FMNMX and F2FP assumed on this pipe"),
        "issue_per_clk": Source("nv-hopper-wp", inferred=True,
                                note="4 warp schedulers x 1 instruction/clk x 32 lanes"),
        "smem_bytes_per_clk": Source("cuda-guide", inferred=True, note="32 banks x 4 B per clock"),
        "hbm_tb_s": Source(ds_key),
    }


_BW_COMMON = dict(
    arch="sm100",
    sms=148,
    clock_mhz=2.25e15 / (148 * 8192) / 1e6,  # 1855.7 MHz: see source note
    mma_flops_per_clk=8192.0,
    mufu_ex2_per_clk=16.0,
    fma_per_clk=128.0,
    alu_per_clk=64.0,
    issue_per_clk=128.0,
    smem_bytes_per_clk=128.0,
    hbm_tb_s=8.0,
)


def _blackwell_sources() -> dict:
    return {
        "sms": Source("nv-b200-ds"),
        "clock_mhz": Source("fa4-paper", inferred=True,
                            note="2.25e15 / (148 SMs x 8192 FLOP/clk) = 1856 MHz"),
        "mma_flops_per_clk": Source("fa4-paper"),
        "mufu_ex2_per_clk": Source("fa4-paper"),
        "fma_per_clk": Source("nv-bwu-blog", inferred=True, note="128 CUDA cores per SM (stated for Blackwell Ultra)"),
        "alu_per_clk": Source("cuda-guide", inferred=True,
                              note="int add/shift 64; FMNMX and F2FP assumed on this pipe"),
        "issue_per_clk": Source("nv-hopper-wp", inferred=True,
                                note="4 warp schedulers x 1 instruction/clk x 32 lanes, as Hopper"),
        "smem_bytes_per_clk": Source("fa4-paper"),
        "hbm_tb_s": Source("nv-b200-ds"),
    }


def _b300_sources() -> dict:
    s = _blackwell_sources()
    s.update({
        "sms": Source("nv-bwu-blog", inferred=True,
                      note="the full die has 160 SMs; 148 enabled as on B200 is our assumption"),
        "clock_mhz": Source("fa4-paper", inferred=True, note="assumed equal to B200"),
        "mma_flops_per_clk": Source("nv-b300-ds", inferred=True,
                                    note="2.25 dense PFLOPS as B200: per SM per clock assumed unchanged"),
        "mufu_ex2_per_clk": Source("nv-bwu-blog", inferred=True, note="2 x B200's 16"),
        "smem_bytes_per_clk": Source("fa4-paper", inferred=True, note="assumed unchanged from B200"),
        "hbm_tb_s": Source("nv-bwu-blog"),
    })
    return s


GPUS: dict[str, GPU] = {
    "h100": GPU(name="H100 SXM", hbm_tb_s=3.35, sources=_hopper_sources("nv-h100-ds"), **_HOPPER_COMMON),
    "h200": GPU(name="H200", hbm_tb_s=4.8, sources=_hopper_sources("nv-h200-ds"), **_HOPPER_COMMON),
    "b200": GPU(name="B200", sources=_blackwell_sources(), **_BW_COMMON),
    "b300": GPU(name="B300", sources=_b300_sources(), **{**_BW_COMMON, "mufu_ex2_per_clk": 32.0}),
}

# arch string -> the GPU this project models for it when only an arch is given
ARCH_DEFAULT_GPU = {"sm90": "h200", "sm100": "b200", "sm103": "b300"}


def get_gpu(name: str) -> GPU:
    """Look a GPU up by key ('h100', 'h200', 'b200', 'b300', case-insensitive, 'H100 SXM' ok) or by arch
    ('sm90' -> H200, 'sm100' -> B200, 'sm103' -> B300)."""
    key = str(name).lower().replace(" sxm", "").replace("_", "").replace("-", "").strip()
    if key in GPUS:
        return GPUS[key]
    arch = key.rstrip("a")
    if arch in ARCH_DEFAULT_GPU:
        return GPUS[ARCH_DEFAULT_GPU[arch]]
    raise ValueError(f"arch={name!r}: supported GPUs are {sorted(GPUS)} or archs {sorted(ARCH_DEFAULT_GPU)}")


# ---- device names -> table rows, and the dense peak of a timed row ---------------------------------------------
# substrings of torch.cuda.get_device_name() -> GPUS key (most specific first); H100 PCIe / NVL are other parts
_NAME_MATCH = (("GB300", "b300"), ("B300", "b300"), ("GB200", "b200"), ("B200", "b200"), ("H200", "h200"),
               ("H100", "h100"))


def gpu_for_device(device_name: str | None) -> GPU | None:
    """The table row of a device name such as 'NVIDIA H200' or 'NVIDIA H100 80GB HBM3'; None if not in the table."""
    if not device_name:
        return None
    name = str(device_name).upper()
    if "H100" in name and ("PCIE" in name or "NVL" in name):
        return None
    for sub, key in _NAME_MATCH:
        if sub in name:
            return GPUS[key]
    return None


def peak_tflops(device_name: str | None, dtype: str = "bfloat16") -> float | None:
    """Dense bf16/fp16 tensor-core peak (TFLOP/s; the two are equal on these parts) of a device; None if unknown."""
    g = gpu_for_device(device_name)
    return None if g is None else g.peak_tflops
