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

from analysis import figures as F  # noqa: E402

OUT = F.figures_dir()
df = F.load_experiments("numerics")
print(f"{len(df)} numerics rows")

# %%
F.show(F.numerics_figure(df, OUT))

# %%
F.show(F.table2(df, OUT))
