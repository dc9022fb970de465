# %% [markdown]
# # The FA4 paper's figures and tables, redrawn from our H200 runs
#
# Same axes and series layout as the paper (TFLOP/s vs sequence length, one bar per implementation;
# 32k total tokens, hidden 2048), drawn from our kernels and the peers measured on an H200 (the paper's
# numbers are B200). FLOPs: forward 4*b*h*s_q*avg_s_k*d (causal counts visible pairs), backward 2.5x.

# %%
import sys
from pathlib import Path

_here = Path(globals().get("__file__", Path.cwd() / "paper_figures.py")).resolve()
ROOT = next(p for p in [*_here.parents, Path.cwd(), *Path.cwd().parents] if (p / "analysis" / "figures.py").exists())
sys.path.insert(0, str(ROOT))

from analysis import ablation_figs as A, numerics_figs as N, paper_figs as P, roofline_figs as R  # noqa: E402
from analysis import select as S, tables as T  # noqa: E402
from analysis.figures import show  # noqa: E402

OUT = S.figures_dir()
attn = S.load_experiments(*S.ATTN_EXPERIMENTS)
print(f"{len(attn)} attention rows")

# %% [markdown]
# ## Fig. 4: forward, hdim 64 / 128 / 256 (non-causal, causal)

# %%
show(P.fig4(attn, OUT))

# %% [markdown]
# ## Fig. 5: forward, hdim (192, 128), causal

# %%
show(P.fig5(attn, OUT))

# %% [markdown]
# ## Fig. 6: backward, per head dim

# %%
show(P.fig6(attn, OUT))

# %% [markdown]
# ## Figs. 7-8: deterministic backward (Fig. 7 causal, shortest-processing-time order; Fig. 8 non-causal)

# %%
show(P.fig7(attn, OUT))
show(P.fig8(attn, OUT))

# %% [markdown]
# ## Table 2: software exp2 accuracy per polynomial degree

# %%
show(T.table2(S.load_experiments("numerics"), OUT))

# %% [markdown]
# ## Table 4: compile time, ours vs the official FA4 (experiment compile_time: fresh processes, caches off)

# %%
show(T.table4(S.load_experiments("compile_time"), OUT))

# %% [markdown]
# ## Coverage: which cells of the grid have timed rows

# %%
cov = T.coverage(attn)
text = T.markdown_table(cov)
legend = S.flag_legend(text)
(OUT / "coverage.md").write_text("**Coverage of the paper grid (timed rows)**\n\n" + T.coverage_summary(cov) + "\n\n"
                                 + text + "\n" + (f"\n{legend}\n" if legend else ""))
print(T.coverage_summary(cov))
print(text)
