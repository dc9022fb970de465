"""The tuning rule shared by ``python run.py tune`` (experiments/tune.py) and its figure (analysis/tune_figs.py):
speedups from per-round ratios, the winner rule, and the tuned-defaults file that kernels/config.py reads.

A candidate is timed round-robin against the default on the same inputs; each round gives r = t_candidate /
t_default (a ``time_ratio`` row's ``samples``). Its speedup per round is 1 / r. A candidate *beats the default* at
a shape when the 20th percentile of its per-round speedups is above 1 (four rounds in five faster: more than the
measured round-to-round noise). The winner of a (arch, hdim, causal, direction) search is, among the candidates that
passed the correctness check and beat the default at every tuned sequence length, the one with the highest
geometric mean of its median speedups; without such a candidate the default stays (no entry is written).
"""
from __future__ import annotations

import datetime as dt
import math
import statistics
from pathlib import Path

from .config import TUNED_DIR, TUNED_FIELDS, load_tuned, normalize_arch

HEADER = """\
# Tuned defaults for {arch}, written by `python run.py tune` (experiments/tune.py) from measured rows; read by
# kernels/config.py at import, over its DEFAULTS table, for the (hdim, causal) of each entry and only the fields of
# its direction. An entry exists only where a candidate beat the table default by more than the measured noise
# (p20 of its per-round speedups > 1 at every tuned sequence length); `evidence` says what was measured and where.
# Delete an entry (or the file) to go back to the table.
"""


def quantile(xs, q: float) -> float:
    """Linear-interpolated quantile of a non-empty sequence."""
    s = sorted(float(x) for x in xs)
    if len(s) == 1:
        return s[0]
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def speedup_stats(ratio_samples) -> dict | None:
    """Per-round ratios t_candidate / t_default -> speedups 1 / r: median, p20, p80, n, and ``beats`` (p20 > 1).
    None without usable samples."""
    sp = [1.0 / float(r) for r in (ratio_samples or []) if r is not None and float(r) > 0 and math.isfinite(float(r))]
    if not sp:
        return None
    p20 = quantile(sp, 0.2)
    return dict(median=float(statistics.median(sp)), p20=p20, p80=quantile(sp, 0.8), n=len(sp), beats=p20 > 1.0)


def pick_winner(candidates: list[dict], seqlens) -> dict | None:
    """The winner among ``candidates`` (each ``{"name", "config", "ok": bool, "stats": {seqlen: speedup_stats}}``)
    for the tuned ``seqlens``: correct (``ok``), beating the default at every sequence length, highest geometric
    mean of median speedups (ties: the first). None when no candidate qualifies."""
    best, best_score = None, None
    for c in candidates:
        st = c.get("stats") or {}
        if not c.get("ok") or any(st.get(s) is None or not st[s]["beats"] for s in seqlens):
            continue
        score = math.exp(sum(math.log(st[s]["median"]) for s in seqlens) / len(seqlens))
        if best_score is None or score > best_score:
            best, best_score = {**c, "score": score}, score
    return best


def tuned_path(arch: str, folder: str | Path | None = None) -> Path:
    return Path(folder or TUNED_DIR) / f"{normalize_arch(arch)}.yaml"


def write_tuned(path: str | Path, arch: str, entries: list[dict], replace: list[tuple] = ()) -> Path:
    """Merge ``entries`` (``{hdim, causal, direction, config, evidence}``) into the tuned file at ``path``: an entry
    replaces the file's entry of the same (hdim, causal, direction); the keys in ``replace`` (tuples of those three)
    are dropped first (a search that found no winner removes an older one). The result is read back with
    kernels.config.load_tuned before it replaces the file, so a bad entry never lands on disk."""
    import yaml

    path = Path(path)
    arch = normalize_arch(arch)
    old = []
    if path.exists():
        load_tuned(path)  # a malformed file is reported, never silently overwritten
        old = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("entries") or []
    key = lambda e: (int(e["hdim"]), bool(e["causal"]), str(e["direction"]))  # noqa: E731
    drop = {key(e) for e in entries} | {(int(h), bool(c), str(d)) for h, c, d in replace}
    merged = [e for e in old if key(e) not in drop] + [_clean(e) for e in entries]
    merged.sort(key=lambda e: (e["direction"], e["hdim"], e["causal"]))
    body = yaml.safe_dump({"arch": arch, "entries": merged}, sort_keys=False, default_flow_style=None, width=120)
    text = HEADER.format(arch=arch) + body
    _check_text(text, path.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".yaml.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


def _check_text(text: str, name: str) -> None:
    """load_tuned on ``text`` saved as ``name`` in a scratch folder (the arch comes from the file name)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="fa4lab-tuned-") as d:
        p = Path(d) / name
        p.write_text(text, encoding="utf-8")
        load_tuned(p)


def _clean(e: dict) -> dict:
    direction = str(e["direction"])
    cfg = {k: e["config"][k] for k in TUNED_FIELDS[direction] if k in e["config"]}
    return {"hdim": int(e["hdim"]), "causal": bool(e["causal"]), "direction": direction, "config": cfg,
            "evidence": {"written": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                         **dict(e.get("evidence") or {})}}
