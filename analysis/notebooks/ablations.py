# %% [markdown]
# # Ablations: what each switch buys, with its spread
#
# Speedup of a switch = t(without) / t(with) at each shape, from median times; the bar is the
# interval from the two timings' p20/p80. The waterfall adds the ideas one at a time from an
# FA3-like configuration (tau 0, no software exp2, no pingpong) to full FA4.

# %%
import sys
from pathlib import Path

_here = Path(globals().get("__file__", Path.cwd() / "ablations.py")).resolve()
ROOT = next(p for p in [*_here.parents, Path.cwd(), *Path.cwd().parents] if (p / "analysis" / "figures.py").exists())
sys.path.insert(0, str(ROOT))

from analysis import figures as F  # noqa: E402

OUT = F.figures_dir()
df = F.load_experiments("fwd_ablation", "bwd_ablation")
print(f"{len(df)} rows from", sorted(set(df["source"])) if "source" in df else "no files")

# %%
F.show(F.ablation_figure(df, OUT))
s = F.switch_speedups(df)
if not s.empty:
    print(s.groupby(["mode", "causal", "switch"])[["speedup", "lo", "hi"]].median().round(3))

# %%
F.show(F.waterfall_figure(df, OUT))
w = F.waterfall_table(df)
if not w.empty:
    print(w.round(1).to_string(index=False))

# %% [markdown]
# ## One-at-a-time sweeps: tau and the emulated exp2 share

# %%
F.show(F.sweep_figure(df, OUT, "rescale_threshold"))
F.show(F.sweep_figure(df, OUT, "exp2_emu_fraction"))
