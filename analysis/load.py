"""Load sweep results (rows.jsonl files) into one pandas DataFrame across runs and experiments.

Reads the format experiments/results.py writes (one JSON object per line; a torn last line of a killed run is
skipped) without importing experiments/: analysis depends only on the files and on kernels/.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd


def read_rows(path: str | os.PathLike) -> list[dict]:
    """The complete rows of one rows.jsonl file (a torn or unparsable line is skipped)."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n") or not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def _files(p: str | os.PathLike) -> list[Path]:
    p = Path(p)
    if p.is_dir():
        return sorted(p.rglob("*.jsonl"))
    if p.exists():
        return [p]
    raise FileNotFoundError(f"load_results: {str(p)!r} is neither a rows.jsonl file nor a folder of them")


def flatten_config(df: pd.DataFrame) -> pd.DataFrame:
    """Add one ``config.<field>`` column per AttnConfig field found in the ``config`` dict column."""
    if "config" not in df or df.empty:
        return df
    flat = pd.json_normalize([c if isinstance(c, dict) else {} for c in df["config"]]).add_prefix("config.")
    flat.index = df.index
    return pd.concat([df, flat.drop(columns=[c for c in flat if c in df])], axis=1)


def load_results(*paths: str | os.PathLike) -> pd.DataFrame:
    """Rows of every rows.jsonl under ``paths`` (files or folders; default ``results/``), one DataFrame.

    Each row keeps its ``config`` dict and gains ``config.<field>`` columns; ``source`` names its file.
    """
    paths = paths or ("results",)
    frames = []
    for p in paths:
        for f in _files(p):
            rows = read_rows(f)
            if rows:
                frames.append(pd.DataFrame(rows).assign(source=str(f)))
    if not frames:
        return pd.DataFrame()
    return flatten_config(pd.concat(frames, ignore_index=True, sort=False))
