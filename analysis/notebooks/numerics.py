# %% [markdown]
# # Numerics of the FA4 algorithm (CPU model, results/numerics/)
#
# Error of the tile-by-tile model (kernels/reference.py) against an fp64 reference, relative to plain
# PyTorch at the input dtype (the correctness rule allows 2x), over tau and the emulated exp2 share;
# the share of rescales skipped; and the software exp2's accuracy per polynomial degree (Table 2).

# %%
import sys
from pathlib import Path

_here = Path(globals().get("__file__", Path.cwd() / "numerics.py")).resolve()
ROOT = next(p for p in [*_here.parents, Path.cwd(), *Path.cwd().parents] if (p / "analysis" / "figures.py").exists())
sys.path.insert(0, str(ROOT))

from analysis import ablation_figs as A, numerics_figs as N, paper_figs as P, roofline_figs as R  # noqa: E402
from analysis import select as S, tables as T  # noqa: E402
from analysis.figures import show  # noqa: E402

OUT = S.figures_dir()
df = S.load_experiments("numerics")
print(f"{len(df)} numerics rows")

# %%
show(N.numerics_figure(df, OUT))

# %%
show(T.table2(df, OUT))
