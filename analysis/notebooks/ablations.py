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

from analysis import ablation_figs as A, numerics_figs as N, paper_figs as P, roofline_figs as R  # noqa: E402
from analysis import select as S, tables as T  # noqa: E402
from analysis.figures import show  # noqa: E402

OUT = S.figures_dir()
df = S.load_experiments("fwd_ablation", "bwd_ablation")
print(f"{len(df)} rows from", sorted(set(df["source"])) if "source" in df else "no files")

# %%
show(A.ablation_figure(df, OUT))
s = A.switch_speedups(df)
if not s.empty:
    print(s.groupby(["mode", "causal", "switch"])[["speedup", "lo", "hi"]].median().round(3))

# %%
show(A.waterfall_figure(df, OUT))
w = A.waterfall_table(df)
if not w.empty:
    print(w.round(1).to_string(index=False))

# %% [markdown]
# ## One-at-a-time sweeps: tau and the emulated exp2 share

# %%
show(A.sweep_figure(df, OUT, "rescale_threshold"))
show(A.sweep_figure(df, OUT, "exp2_emu_fraction"))

# %% [markdown]
# ## `python run.py tune`: every candidate against the default (the search that writes conf/tuned/<arch>.yaml)

# %%
from analysis import tune_figs as TF  # noqa: E402

tdf = S.load_experiments("tune")
show(TF.tune_figure(tdf, OUT))
tw = TF.winners(TF.tune_speedups(tdf))
if not tw.empty:
    print(tw.to_string(index=False))
