"""The one peak table: dense (no 2:4 sparsity) bf16/fp16 tensor-core TFLOP/s, HBM bandwidth, SM count and
boost clock of the GPUs we compare against, each with its source. ``None`` = not confirmed by a source.

Datasheets quote bf16/fp16 "with sparsity"; the dense rate is half of it. The dense H100/H200 rate
989.4 TFLOP/s equals 132 SMs x 4096 FLOP/clk/SM x 1.83 GHz, i.e. it is rated at 1830 MHz, below the
1980 MHz maximum SM boost clock that NVML reports.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Peak:
    gpu: str
    arch: str  # sm90 / sm100 / sm103
    bf16_tflops: float  # dense tensor-core peak, fp32 accumulate; fp16 is the same on these parts
    fp16_tflops: float
    hbm_tbps: float  # TB/s (1e12 bytes/s)
    sm_count: int | None
    boost_clock_mhz: int | None
    source: str
    note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


PEAKS: dict[str, Peak] = {
    "H100 SXM": Peak(
        gpu="H100 SXM", arch="sm90", bf16_tflops=989.4, fp16_tflops=989.4, hbm_tbps=3.35, sm_count=132,
        boost_clock_mhz=1980,
        source=("NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100): BF16/FP16 Tensor "
                "Core 1,979 TFLOPS with sparsity, 3.35 TB/s; NVIDIA H100 SXM5 final specs (GPU boost 1.98 GHz, "
                "132 SMs / 66 TPCs) as reported by prohardver.hu and glennklockwood.com/garden/processors/h100 "
                "(BF16 matrix 989.4 dense)"),
    ),
    "H200": Peak(
        gpu="H200", arch="sm90", bf16_tflops=989.4, fp16_tflops=989.4, hbm_tbps=4.8, sm_count=132,
        boost_clock_mhz=1980,
        source=("NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200): BF16/FP16 Tensor "
                "Core 1,979 TFLOPS with sparsity, 4.8 TB/s HBM3e, same GH100 SXM5 compute as H100 SXM "
                "(132 SMs, 1.98 GHz boost)"),
        note="geektopia.es (H200 launch report) quotes a ~1930 MHz max boost; metadata records the NVML clock",
    ),
    "B200": Peak(
        gpu="B200", arch="sm100", bf16_tflops=2250.0, fp16_tflops=2250.0, hbm_tbps=8.0, sm_count=148,
        boost_clock_mhz=None,
        source=("NVIDIA HGX B200 datasheet: FP16/BF16 Tensor Core 36 PFLOPS with sparsity per 8 GPUs "
                "(4.5 sparse / 2.25 dense PFLOPS per GPU, 1000 W), HBM3e 8 TB/s per GPU; 148 SMs per "
                "hmc-tech.com B200 spec page"),
        note="boost clock not confirmed by an NVIDIA source; third-party pages list 1.98 GHz",
    ),
    "B300": Peak(
        gpu="B300", arch="sm103", bf16_tflops=2250.0, fp16_tflops=2250.0, hbm_tbps=8.0, sm_count=None,
        boost_clock_mhz=None,
        source=("NVIDIA HGX B300 datasheet: FP16/BF16 Tensor Core 36 PFLOPS with sparsity per 8 GPUs "
                "(2.25 dense PFLOPS per GPU, as glennklockwood.com/garden/processors/B300 tabulates); "
                "developer.nvidia.com/blog/inside-nvidia-blackwell-ultra-the-chip-powering-the-ai-factory-era: "
                "288 GB HBM3e at 8 TB/s, 160 SMs in the full die"),
        note="enabled SM count of the shipping B300 and its boost clock not confirmed (full die: 160 SMs)",
    ),
}

# substrings of torch.cuda.get_device_name() -> table key (most specific first)
_NAME_MATCH = (("H100", "H100 SXM"), ("H200", "H200"), ("B300", "B300"), ("GB300", "B300"), ("B200", "B200"),
               ("GB200", "B200"))


def peak_for(device_name: str | None) -> Peak | None:
    """The table row for a device name such as 'NVIDIA H200' or 'NVIDIA H100 80GB HBM3'; None if unknown.

    H100 PCIe / NVL parts are not in the table (different clocks and bandwidth) and return None.
    """
    if not device_name:
        return None
    name = device_name.upper()
    if "H100" in name and ("PCIE" in name or "NVL" in name):
        return None
    for key, row in _NAME_MATCH:
        if key in name:
            return PEAKS[row]
    return None


def peak_tflops(device_name: str | None, dtype: str = "bfloat16") -> float | None:
    p = peak_for(device_name)
    if p is None:
        return None
    return p.fp16_tflops if dtype in ("float16", "fp16") else p.bf16_tflops
