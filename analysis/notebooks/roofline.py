# %% [markdown]
# # Roofline: what each switch should buy, and what it bought
#
# The model (analysis/roofline.py) counts, per tile, the cycles of each resource: tensor cores (MMA),
# shared memory, MUFU exp2, the FMA and ALU pipes and instruction issue. With softmax overlapped
# (pingpong / intra-warpgroup overlap) a tile costs the max of them; serialised, MMA side + softmax
# side. Calibration microbenchmarks (experiments/microbench) replace datasheet rates with measured
# ones when their rows are present; the output says which values were used.

# %%
import sys
from pathlib import Path

_here = Path(globals().get("__file__", Path.cwd() / "roofline.py")).resolve()
ROOT = next(p for p in [*_here.parents, Path.cwd(), *Path.cwd().parents] if (p / "analysis" / "figures.py").exists())
sys.path.insert(0, str(ROOT))

from analysis import ablation_figs as A, numerics_figs as N, paper_figs as P, roofline_figs as R  # noqa: E402
from analysis import select as S, tables as T  # noqa: E402
from analysis.figures import show  # noqa: E402
from analysis import roofline as rl  # noqa: E402

OUT = S.figures_dir()
calib = rl.load_calibration([S.results_root() / p.split("results/", 1)[1] for p in rl.MICROBENCH_PATHS])
print("calibration rows found:", sorted(calib) or "none (datasheet values)")

# %% [markdown]
# ## The FA4 paper's tables, reproduced by the model (B200, 128 x 128 x 128 tiles)

# %%
b200 = rl.GPUS["b200"]
for name, tc in [("fwd M=128", rl.tile_cost(b200, "fwd", 128, 128, 128)),
                 ("fwd M=256", rl.tile_cost(b200, "fwd", 256, 128, 128)),
                 ("bwd 1-CTA", rl.tile_cost(b200, "bwd", 128, 128, 128)),
                 ("bwd 2-CTA", rl.tile_cost(b200, "bwd", 128, 128, 128, two_cta=True))]:
    print(f"{name:10s}  MMA {tc.cycles['mma']:6.0f}  smem {tc.cycles['smem']:6.0f}  exp {tc.cycles['mufu']:6.0f}"
          f"  -> bound: {tc.bound}")

# %% [markdown]
# ## Predicted bound per GPU and switch (hdim 128)

# %%
rows = rl.table(hdims=(128,), calib=calib)
import pandas as pd  # noqa: E402

t = pd.DataFrame(rows)[["gpu", "mode", "causal", "variant", "tflops", "bound"]]
print(t.pivot_table(index=["gpu", "mode", "causal"], columns="variant", values="tflops").round(0).to_string())
for g in ("h200", "b200"):
    _, _, used = rl.calibrated_gpu(rl.get_gpu(g), calib)
    print(g, "values used:", used)

# %%
show(R.roofline_bounds_figure(OUT, calib=calib))

# %% [markdown]
# ## Calibration: exp2 throughput vs the share emulated on the FMA pipe

# %%
mb = S.load_experiments("microbench")
show(R.microbench_figure(mb, OUT))

# %% [markdown]
# ## Measured vs predicted, per config of our kernel

# %%
attn = S.load_experiments(*S.ATTN_EXPERIMENTS)
show(R.roofline_figure(attn, OUT, calib=calib))
pts = R.roofline_points(attn, calib)
if not pts.empty:
    print(pts.groupby(["mode", "causal", "variant"])[["tflops", "predicted_tflops", "efficiency"]].median().round(2))
