"""`python run.py figures` on a results folder where a set's older rows sit in rows.jsonl.xz and new round-robin rows
are appended to its rows.jsonl (what the lead's H200 re-run does): the new rows reach the README block, the coverage
table and the figures, replace the separately timed rows of their cells, and a later round-robin run of the same
cells replaces an earlier one. The round-robin rows are a real compare sweep's on the CPU (experiments/compare_job.py),
relabelled as an H200 run of ours against the official FA4, so a field the runner stops writing fails here."""
import lzma
import json

import pytest

from analysis import figures as F
from analysis.readme import current_block, update_readme, BEGIN, END
from analysis.select import ATTN_EXPERIMENTS, attn_times, load_experiments

H200 = "NVIDIA H200"
NAMES = {"fa4_model": "fa4", "reference": "fa4_official"}
# what analysis reads from a round-robin row: if the runner stops writing one of these, the tables go wrong silently
READ_FIELDS = {"kind", "metric", "status", "value", "n", "p20", "p80", "backend", "variant", "mode", "hdim", "causal",
               "seqlen_q", "seqlen_k", "batch", "heads", "rr_entries", "throttled_share", "git_sha", "time", "job_key",
               "run_id", "experiment", "gpu_name"}


@pytest.fixture(scope="module")
def compare_rows(tmp_path_factory):
    """The rows of a CPU compare sweep (fwd_peers: fa4_model = our default, reference = a peer), as an H200 run."""
    from test_sweep import composed

    from experiments.results import read_rows
    from experiments.sweep import run_sweep

    tmp = tmp_path_factory.mktemp("sweep")
    cfg = composed("experiment=fwd_peers", "shape=cpu", "isolation=inline", "progress=false", "bench=quick",
                   f"results_dir={tmp}", "experiment.backends=[fa4_model]", "experiment.peers=[reference]",
                   "experiment.check=false", "shape.grid.seqlens=[64]", "shape.grid.causal=[false]")

    class Quiet:
        def write(self, s):
            pass

        def flush(self):
            pass

    assert run_sweep(cfg, out=Quiet()) == 0
    rows = [r for r in read_rows(tmp / "fwd_peers" / "rows.jsonl") if r.get("metric") in ("time_ms", "time_ratio")]
    assert {r["metric"] for r in rows} == {"time_ms", "time_ratio"}
    for r in rows:
        assert READ_FIELDS <= set(r), sorted(READ_FIELDS - set(r))
    out = []
    for r in rows:
        r = dict(r, backend=NAMES[r["backend"]], gpu_name=H200, throttled_share=0.25, experiment="fwd_peers",
                 rr_entries=[NAMES.get(e, e) for e in r["rr_entries"]])
        if r["metric"] == "time_ratio":
            r.update(baseline="fa4", baseline_backend="fa4")
        if r["metric"] == "time_ms" and not r.get("tflops"):
            r["tflops"] = 1.0
        out.append(r)
    return out


def _separate(rr_rows):
    """Two separately timed rows (the 2026-11-29 kind) of the same shape: official FA4 1.5x slower than ours."""
    base = next(r for r in rr_rows if r["metric"] == "time_ms")
    keep = ("mode", "hdim", "hdim_v", "causal", "seqlen_q", "seqlen_k", "batch", "heads", "dtype")
    shape = {k: base.get(k) for k in keep}
    return [dict(shape, kind="attn", experiment="fwd_peers", metric="time_ms", status="ok", backend=b, variant=v,
                 value=ms, n=10, p20=ms, p80=ms, tflops=100.0 / ms, gpu_name=H200, git_sha=None, git_dirty=None,
                 job_key=f"sep-{b}", run_id="old", time="2026-11-29T10:00:00+00:00")
            for b, v, ms in (("fa4", "default", 1.0), ("fa4_official", "peer", 1.5))]


def _write(path, rows, archive=False):
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if archive:
        path.with_name("rows.jsonl.xz").write_bytes(lzma.compress(text.encode()))
    else:
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)


def _fwd_table(block):
    return block[block.index("Forward, ours / official FA4"):block.index("Backward")]


def test_appended_round_robin_rows_replace_archived_separate_rows_everywhere(compare_rows, tmp_path, monkeypatch):
    for k in ("FA4LAB_RESULTS", "FA4LAB_FIGURES", "FA4LAB_SCRATCH"):  # figures.main sets them: restore afterwards
        monkeypatch.setenv(k, "")
    root = tmp_path / "results"
    rows_file = root / "h200" / "fwd_peers" / "rows.jsonl"
    _write(rows_file, _separate(compare_rows), archive=True)
    rows_file.write_text("")  # as experiments.results archive leaves it

    before = current_block(root)
    assert "| 64 | no | 1.50†‡ |" in _fwd_table(before)
    assert "fa4 +1 sep‡" in before and "† separately timed" in before

    _write(rows_file, compare_rows)  # the re-run appends its round-robin rows
    ratio = next(r for r in compare_rows if r["metric"] == "time_ratio")
    after = current_block(root)
    assert f"| 64 | no | {ratio['value']:.2f} |" in _fwd_table(after)  # no mark: rr, >= 10 rounds, provenance
    assert "1.50" not in after and "fa4 +1 rr |" in after
    d = attn_times(load_experiments(*ATTN_EXPERIMENTS, root=root, scratch=False))
    assert len(d) == 2 and d["rr_entries"].notna().all()  # the separate rows of the cell are gone from the figures

    # a later round-robin run of the same cells (another run id, later time) replaces the earlier one, not pooled
    later = [dict(r, run_id="later", time="2099-01-01T00:00:00+00:00") for r in compare_rows]
    for r in later:
        if r["metric"] == "time_ratio":
            r["value"] = 2.0
    _write(rows_file, later)
    assert "| 64 | no | 2.00 |" in _fwd_table(current_block(root))
    d = attn_times(load_experiments(*ATTN_EXPERIMENTS, root=root, scratch=False))
    assert len(d) == 2 and set(d["run_id"]) == {"later"}

    # `python run.py figures --results ... --out ...` draws them (the README is written only for the committed sets)
    out = tmp_path / "figs"
    assert F.main(["--results", str(root), "--out", str(out)]) == 0
    assert (out / "fig4_fwd.png").stat().st_size > 5000
    assert "fa4 +1 rr" in (out / "coverage.md").read_text()
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n\n{BEGIN}\nold\n{END}\n\nrest\n")
    assert update_readme(current_block(root), readme)
    text = readme.read_text()
    assert text.startswith("intro\n\n") and text.endswith("\n\nrest\n") and "| 64 | no | 2.00 |" in text


def test_rows_missing_provenance_or_rounds_are_marked(compare_rows, tmp_path):
    root = tmp_path / "results"
    rows = [dict(r, git_sha=None) if r["metric"] == "time_ratio" else r for r in compare_rows]
    _write(root / "h200" / "fwd_peers" / "rows.jsonl", rows)
    ratio = next(r for r in compare_rows if r["metric"] == "time_ratio")
    block = current_block(root)
    assert f"| 64 | no | {ratio['value']:.2f}‡ |" in _fwd_table(block) and "‡ a row without" in block
    few = [dict(r, n=5) for r in compare_rows]
    (root / "h200" / "fwd_peers" / "rows.jsonl").write_text("")
    _write(root / "h200" / "fwd_peers" / "rows.jsonl", few)
    block = current_block(root)
    assert f"| 64 | no | {ratio['value']:.2f}° |" in _fwd_table(block) and "° fewer than 10 rounds" in block


def test_compile_time_rows_reach_table4_in_the_readme_block(tmp_path):
    """The compile_time runner's rows (three fresh CPU processes of fa4_model, relabelled as ours and the official
    FA4 on an H200) give the README's Table 4: medians, samples per backend, the official / ours ratio."""
    from experiments import compile_time as ct

    jobs = ct.expand(dict(backends=["fa4_model"], hdims=[64], causal=[False], modes=["fwd"], samples=3, seqlen=64,
                          hidden=128))
    rows = [r for j in jobs for r in ct.run({**j, "experiment": "compile_time"})]
    assert {"kind", "backend", "metric", "value", "mode", "hdim", "causal", "status"} <= set(rows[0])
    out = []
    for b, scale in (("fa4", 1.0), ("fa4_official", 4.0)):
        out += [dict(r, backend=b, gpu_name=H200, value=r["value"] * scale) for r in rows]
    _write(tmp_path / "results" / "h200" / "compile_time" / "rows.jsonl", out)
    block = current_block(tmp_path / "results")
    table = block[block.index("Compile time (paper Table 4;"):block.index("Coverage")]
    line = next(ln for ln in table.splitlines() if ln.startswith("| fwd | 64 | no |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[5] == "4" and cells[-2:] == ["3", "3"], line  # ratio official / ours; 3 samples each
    assert "NVIDIA H200" in table


def test_audit_lists_what_keeps_the_rows_from_done(compare_rows, tmp_path, capsys):
    from analysis import audit

    root = tmp_path / "results"
    rows_file = root / "h200" / "fwd_peers" / "rows.jsonl"
    _write(rows_file, _separate(compare_rows), archive=True)
    got = "\n".join(line for _, line in audit.audit(root))
    assert "fwd_peers: 2 timed rows drawn: 2 separate, 2 few_rounds" not in got  # n = 10 on the separate rows
    assert "fwd_peers: 2 timed rows drawn: 2 separate, 2 no_throttled_share, 2 no_git_sha" in got
    assert "fwd_peers: no ratio rows used (its timed rows are not round-robin)" in got
    assert "compile_time: no rows yet" in got and "bwd_peers: no timed rows drawn" in got
    _write(rows_file, compare_rows)
    got = audit.audit(root)
    assert (True, "fwd_peers: 2 timed rows drawn") in got and (True, "fwd_peers: 1 ratio rows used") in got
    cov = next(line for ok, line in got if line.startswith("coverage fwd"))
    assert cov.startswith("coverage fwd: 1 of 49 cells timed (the paper grid and any other with rows); no rows: 64 1k,")
    assert audit.main(["--results", str(root)]) == 0 and audit.main(["--results", str(root), "--strict"]) == 1
    assert "GAP  coverage fwd" in capsys.readouterr().out
