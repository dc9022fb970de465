"""Load sweep results (rows.jsonl files) into one pandas DataFrame across runs and experiments.

Reads the format experiments/results.py writes (one JSON object per line; a torn last line of a killed run is
skipped; a set's archived rows in ``rows.jsonl.xz`` (or a legacy ``rows.jsonl.gz``) beside its ``rows.jsonl`` come
first) without importing
experiments/: analysis depends only on the files and on kernels/.
"""
from __future__ import annotations

import gzip
import lzma
import io
import json
import os
from pathlib import Path

import pandas as pd


ARCHIVE_SUFFIXES = (".xz", ".gz")  # rows.jsonl.xz: a set's archived rows (experiments/results.py archive); .gz: legacy


def _parse(f) -> list[dict]:
    rows = []
    for line in f:
        if not line.endswith("\n") or not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def _read_archive(path: Path) -> list[dict]:
    unpack = lzma.decompress if path.name.endswith(".xz") else gzip.decompress
    with io.TextIOWrapper(io.BytesIO(unpack(path.read_bytes())), encoding="utf-8") as f:
        return _parse(f)


def set_path(p: str | os.PathLike) -> Path:
    """The live ``rows.jsonl`` of a set named by it or by its archive ``rows.jsonl.xz`` / ``.gz``."""
    p = Path(p)
    for suffix in ARCHIVE_SUFFIXES:
        if p.name.endswith(".jsonl" + suffix):
            return p.with_name(p.name[: -len(suffix)])
    return p


def _archive_of(p: Path) -> Path | None:
    """The archive of the set whose live file is ``p`` (.xz first), or None."""
    return next((a for a in (Path(str(p) + s) for s in ARCHIVE_SUFFIXES) if a.exists()), None)


def set_exists(p: str | os.PathLike) -> bool:
    """Whether a set has rows on disk: its rows.jsonl or its archive."""
    p = set_path(p)
    return p.exists() or _archive_of(p) is not None


def read_rows(path: str | os.PathLike) -> list[dict]:
    """The complete rows of one set: its archive ``rows.jsonl.xz`` (or legacy .gz; if any), then its ``rows.jsonl``
    (a torn or unparsable line is skipped). A path ending in .xz / .gz reads that archive only."""
    path = Path(path)
    if path.name.endswith(ARCHIVE_SUFFIXES):
        return _read_archive(path)
    archive = _archive_of(path)
    rows = _read_archive(archive) if archive is not None else []
    if path.exists():
        with open(path, encoding="utf-8") as f:
            rows += _parse(f)
    return rows


def _files(p: str | os.PathLike) -> list[Path]:
    """The sets under ``p``, each named by its rows.jsonl (whether or not only its archive is on disk)."""
    p = Path(p)
    if p.is_dir():
        return sorted({set_path(f) for f in [*p.rglob("*.jsonl"), *(a for s in ARCHIVE_SUFFIXES
                                                                   for a in p.rglob("*.jsonl" + s))]})
    if set_exists(p):
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
    """Rows of every rows.jsonl under ``paths`` (files or folders; default ``results/``), one DataFrame; a set's
    archive (rows.jsonl.xz) is read with it.

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
