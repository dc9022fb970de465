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

from analysis import figures as F  # noqa: E402

OUT = F.figures_dir()
attn = F.load_experiments(*F.ATTN_EXPERIMENTS)
print(f"{len(attn)} attention rows")

# %% [markdown]
# ## Fig. 4: forward, hdim 128 (non-causal, causal)

# %%
F.show(F.fig4(attn, OUT))

# %% [markdown]
# ## Fig. 5: forward, hdim (192, 128), causal

# %%
F.show(F.fig5(attn, OUT))

# %% [markdown]
# ## Fig. 6: backward, hdim 128

# %%
F.show(F.fig6(attn, OUT))

# %% [markdown]
# ## Figs. 7-8: deterministic backward (non-causal; causal with shortest-processing-time order)

# %%
F.show(F.fig7(attn, OUT))
F.show(F.fig8(attn, OUT))

# %% [markdown]
# ## Table 2: software exp2 accuracy per polynomial degree

# %%
F.show(F.table2(F.load_experiments("numerics"), OUT))

# %% [markdown]
# ## Table 4: compile time (first call), ours vs the official FA4

# %%
F.show(F.table4(attn, OUT))
