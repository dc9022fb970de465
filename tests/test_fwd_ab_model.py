"""scripts/fwd_ab.py puts the roofline model's bound beside each timed config of this tree (model_tflops,
model_bound; analysis/roofline.py with the TMA fill counted): the device name to the hardware table's key, the bound
for a config's fields, and no answer (not an error) where the model has none. CPU only."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

SHAPE = dict(batch=4, seqlen_q=8192, seqlen_k=8192, heads=32)


def test_gpu_key_from_the_device_name():
    from fwd_ab import gpu_key

    assert gpu_key("NVIDIA H100 80GB HBM3") == "h100" and gpu_key("NVIDIA H200") == "h200"
    assert gpu_key("NVIDIA A100-SXM4-80GB") is None


def test_model_bound_per_config():
    from fwd_ab import model_bound

    base = model_bound("h100", 64, 64, False, {}, SHAPE)
    wide = model_bound("h100", 64, 64, False, {"p_smem": True, "tile_n": 192}, SHAPE)
    assert base["model_bound"] in ("mma", "mufu") and wide["model_bound"] == "smem"
    assert wide["model_tflops"] < base["model_tflops"]
    assert model_bound(None, 64, 64, False, {}, SHAPE) == {}
    assert model_bound("h100", 64, 64, False, {"tile_m": 7}, SHAPE) == {}  # a config the model refuses
