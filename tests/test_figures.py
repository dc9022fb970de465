"""Figure functions render from a small synthetic DataFrame (a test of the plotting code, not a result),
say "no rows for X yet" without data, and compute speedups / tables correctly."""
import itertools

import pandas as pd
import pytest

from analysis import ablation_figs as A, numerics_figs as N, paper_figs as P, roofline_figs as R
from analysis import figures as F
from analysis import select as S, tables as T

GPU = "NVIDIA H200"
SEQLENS = (1024, 4096, 8192)


def _attn(backend, variant, mode, hdim, hdim_v, causal, seqlen, tflops, config=None, **extra):
    batch, heads = 32768 // seqlen, 2048 // hdim
    ms = 1.0e3 / tflops  # any monotone map: the plots use tflops, the speedups use times
    return dict(kind="attn", experiment="x", backend=backend, variant=variant, mode=mode, metric="time_ms",
                value=ms, p20=ms * 0.98, p80=ms * 1.02, tflops=tflops, status="ok", gpu_name=GPU,
                batch=batch, seqlen_q=seqlen, seqlen_k=seqlen, heads=heads, hdim=hdim, hdim_v=hdim_v,
                causal=causal, dtype="bfloat16", config=config, n=10, time="2026-11-30T12:00:00+00:00", **extra)


VCFG = {"fa3_like": {"rescale_threshold": 0.0, "exp2_emu_fraction": 0.0, "pingpong": False},
        "fa3_like+pingpong": {"rescale_threshold": 0.0, "exp2_emu_fraction": 0.0, "pingpong": True},
        "fa3_like+pingpong+tau8": {"rescale_threshold": 8.0, "exp2_emu_fraction": 0.0, "pingpong": True}, "full": {}}


def synthetic() -> pd.DataFrame:
    rows = []
    peers = {"fa4_official": 0.9, "sdpa_cudnn": 0.95, "sdpa_flash": 0.6}
    for mode, (hd, hv), causal, s in itertools.product(("fwd", "bwd"), ((128, 128), (192, 128)), (False, True),
                                                       SEQLENS):
        base = 500.0 + s / 100
        ours = _attn("fa4", "default", mode, hd, hv, causal, s, base, config={"deterministic": False})
        rows.append(ours)
        for p, f in peers.items():
            rows.append(_attn(p, "peer", mode, hd, hv, causal, s, base * f))
        if s == SEQLENS[0]:  # the compile_time experiment: 3 fresh-process samples per cell
            for i, (b, first, second) in enumerate([("fa4_official", 2.0, 0.01), ("fa4", 0.5, 0.001)] * 3):
                rows.append(dict(ours, kind="compile_time", experiment="compile_time", backend=b, variant="default",
                                 sample=i // 2, metric="first_call_s", value=first + 0.1 * (i // 2 - 1), tflops=None))
                rows.append(dict(rows[-1], metric="second_call_s", value=second))
    variants = {"full": 1.0, "no_pingpong": 0.8, "tau0": 0.95, "no_exp2_emu": 0.97, "fa3_like": 0.7,
                "fa3_like+pingpong": 0.85, "fa3_like+pingpong+tau8": 0.93,
                "rescale_threshold=0.0": 0.95, "rescale_threshold=8.0": 1.0,
                "exp2_emu_fraction=0.0": 0.97, "exp2_emu_fraction=0.25": 0.99}
    for causal, s in itertools.product((False, True), SEQLENS):
        for v, f in variants.items():
            rows.append(_attn("fa4", v, "fwd", 128, 128, causal, s, 600 * f, config=VCFG.get(v, {"pingpong": v != "no_pingpong"})))
        for v, f, det in (("full", 1.0, False), ("deterministic", 0.85, True), ("two_cta", 1.05, False)):
            rows.append(_attn("fa4", v, "bwd", 128, 128, causal, s, 450 * f,
                              config={"deterministic": det, "two_cta": v == "two_cta"}))
        rows.append(_attn("fa4_official_det", "peer", "bwd", 128, 128, causal, s, 400))
    for d, (err, sh) in itertools.product((3, 4), ((1e-4, 0.9),)):
        for m, v in (("max_rel_err_fp32", err / d), ("bf16_equal_share", sh)):
            rows.append(dict(kind="poly", experiment="numerics", backend="fa4_model", mode="exp2", metric=m,
                             value=v, status="ok", degree=d, coeffs="ours_round"))
    for tau, frac, dt in itertools.product((0.0, 4.0, 8.0), (0.0, 0.25), ("bfloat16", "float16")):
        for m, v in (("out_err_ratio", 1.0 + tau / 100 + frac), ("skipped_share", tau / 10)):
            rows.append(dict(kind="numerics", experiment="numerics", backend="fa4_model", mode="fwd", metric=m,
                             value=v, status="ok", dist="normal", dtype=dt, hdim=64, tau=tau, exp2_fraction=frac))
    for frac, v in ((0.0, 15.9), (0.125, 17.0), (0.5, 24.0), (1.0, 17.4)):
        metric = {0.0: "mufu_ex2_per_clk_sm", 1.0: "poly_exp2_per_clk_sm"}.get(frac, "mix_exp2_per_clk_sm")
        rows.append(dict(kind="microbench", metric=metric, value=v, unit="exp/clk/SM", fraction=frac, status="ok",
                         gpu_name=GPU, method="synthetic"))
    df = pd.DataFrame(rows)
    df["config.deterministic"] = [(c or {}).get("deterministic") if isinstance(c, dict) else None for c in df["config"]]
    df["config.two_cta"] = [(c or {}).get("two_cta") if isinstance(c, dict) else None for c in df["config"]]
    return df


@pytest.fixture(scope="module")
def df():
    return synthetic()


def _png(res):
    path, msg = res
    assert path is not None, msg
    assert path.exists() and path.stat().st_size > 5000 and path.read_bytes()[:4] == b"\x89PNG"
    return path


@pytest.mark.parametrize("fn", [P.fig4, P.fig5, P.fig6, P.fig7, P.fig8, A.ablation_figure, A.waterfall_figure,
                                N.numerics_figure, R.microbench_figure])
def test_figures_render(df, tmp_path, fn):
    _png(fn(df, tmp_path))


@pytest.mark.parametrize("fn", [P.fig4, P.fig5, P.fig6, P.fig7, P.fig8, A.ablation_figure, A.waterfall_figure,
                                N.numerics_figure, R.microbench_figure, R.roofline_figure, T.table2, T.table4])
def test_no_rows_message(tmp_path, fn):
    for empty in (pd.DataFrame(), pd.DataFrame([dict(kind="attn", metric="time_ms", status="fail", value=None)])):
        obj, msg = fn(empty, tmp_path)
        assert obj is None and msg.startswith("no rows for"), msg
    assert not list(tmp_path.iterdir())


def test_fig4_series_and_filtering(df):
    d = S.attn_times(df)
    fwd128 = d[(d["mode"] == "fwd") & (d["hdim"] == 128) & (d["hdim_v"] == 128) & (d["variant"].isin(["default", "peer"]))]
    assert set(fwd128["series"]) == {"ours (fa4lab)", "FA4 official (sm90)", "cuDNN (SDPA)", "FA2 (SDPA flash)"}
    cpu = df.iloc[:1].assign(gpu_name=None)
    assert S.attn_times(cpu).empty  # CPU rows are not drawn


def test_deterministic_series(df):
    d = P.deterministic_series(df)
    assert {"ours", "ours, deterministic (SPT)"} <= set(d["series"])
    assert "FA4 official, deterministic" in set(d["series"])
    assert not (d["variant"] == "two_cta").any()
    naive = df[df["variant"] == "deterministic"].assign(variant="deterministic_naive")
    d2 = P.deterministic_series(pd.concat([df, naive], ignore_index=True))
    assert "ours, deterministic (naive order)" in set(d2["series"])


def test_switch_speedups(df):
    s = A.switch_speedups(df)
    sp = s.groupby("switch")["speedup"].median()
    assert sp["pingpong"] == pytest.approx(1 / 0.8)  # t(no_pingpong) / t(full)
    assert sp["2-CTA (on)"] == pytest.approx(1.05)  # the variant turns it on: t(full) / t(two_cta)
    assert sp["deterministic (on)"] == pytest.approx(0.85)
    assert (s["lo"] <= s["speedup"]).all() and (s["speedup"] <= s["hi"]).all()


def test_waterfall_order(df):
    t = A.waterfall_table(df)
    fwd = t[(t["mode"] == "fwd") & (~t["causal"])]
    # on sm90 the exp2 split defaults to 0: the last step compiles the kernel of the one before, so they are one bar
    assert list(fwd["variant"]) == ["fa3_like", "fa3_like+pingpong", "fa3_like+pingpong+tau8 = full"]
    assert list(fwd["tflops"]) == pytest.approx([600 * f for f in (0.7, 0.85, 0.93)])


def test_tables(df, tmp_path):
    t2, msg = T.table2(df, tmp_path)
    assert set(t2["degree"]) == {3, 4} and (tmp_path / "table2_poly_accuracy.md").exists(), msg
    t4, msg = T.table4(df, tmp_path)
    assert {"ours first call (s)", "FA4 official first call (s)"} <= set(t4.columns), msg
    assert (t4["ratio (official / ours)"] == 4.0).all()  # medians over the samples: 2.0 / 0.5
    assert (t4["ours cached call (s)"] == 0.001).all() and (t4["FA4 official cached call (s)"] == 0.01).all()
    assert (t4["ours samples"] == 3).all() and (t4["FA4 official samples"] == 3).all()
    sweep_rows = df[df["kind"] != "compile_time"]  # first calls inside sweeps are no compile-time measurement
    assert T.table4(sweep_rows, tmp_path / "x")[0] is None
    assert "| mode |" in (tmp_path / "table4_compile_time.md").read_text()


def test_roofline_figure(df, tmp_path):
    pts = R.roofline_points(df, calib={})
    placed = pts[pts["predicted_tflops"].notna()]
    assert len(placed) and (placed["predicted_tflops"] > 0).all() and pts["bound"].notna().all()
    assert pts["predicted_tflops"].notna().all()  # (192, 128) backward included (kernels/sm90/bwd_wide.py)
    odd = df[df["mode"] == "bwd"].head(1).assign(hdim=96, hdim_v=96)  # no kernel at hd 96: kept, says why
    got = R.roofline_points(odd, calib={})
    assert len(got) == 1 and got["predicted_tflops"].isna().all() and got["bound"].notna().all()
    _png(R.roofline_figure(df, tmp_path, calib={}))
    _png(R.roofline_bounds_figure(tmp_path, calib={}))


def test_sweep_figure(df, tmp_path):
    _png(A.sweep_figure(df, tmp_path, "rescale_threshold"))
    assert A.sweep_figure(df, tmp_path, "nope")[0] is None


def test_load_experiments_reads_gpu_folders(tmp_path, monkeypatch):
    import json

    for sub in ("fwd_peers", "h200/fwd_peers"):
        p = tmp_path / sub / "rows.jsonl"
        p.parent.mkdir(parents=True)
        p.write_text(json.dumps(dict(kind="attn", metric="time_ms", value=1.0, status="ok", job_key=sub)) + "\n")
    got = S.load_experiments("fwd_peers", root=tmp_path)
    assert list(got["job_key"]) == ["h200/fwd_peers"]  # committed sets only by default
    assert len(S.load_experiments("fwd_peers", root=tmp_path, scratch=True)) == 2
    monkeypatch.setenv("FA4LAB_SCRATCH", "1")
    assert len(S.load_experiments("fwd_peers", root=tmp_path)) == 2
    monkeypatch.setenv("FA4LAB_RESULTS", str(tmp_path))
    assert S.load_experiments("bwd_peers").empty


def test_switch_already_off_by_default_is_not_a_speedup():
    """On sm90 the exp2 split defaults to 0: `no_exp2_emu` compiles the same kernel as `full`, so no point."""
    rows = [_attn("fa4", "full", "fwd", 128, 128, False, 8192, 700.0, config={}),
            _attn("fa4", "no_exp2_emu", "fwd", 128, 128, False, 8192, 720.0, config={"exp2_emu_fraction": 0.0}),
            _attn("fa4", "no_pingpong", "fwd", 128, 128, False, 8192, 650.0, config={"pingpong": False})]
    s = A.switch_speedups(pd.DataFrame(rows))
    assert list(s["switch"]) == ["pingpong"]
    recorded = dict(rows[1], resolved_config_hash="something-else")  # a recorded hash wins over re-resolving
    s = A.switch_speedups(pd.DataFrame([rows[0], recorded]))
    assert list(s["switch"]) == ["exp2 emulation"]


def _ab(variant, mode, seqlen, ratio, config, ab_baseline="full", **extra):
    """An ab_ratio row: t(full) / t(variant) over interleaved pairs, spread +-10% (so it cannot pass for a median)."""
    row = _attn("fa4", variant, mode, 128, 128, False, seqlen, 1.0, config=config, ab_baseline=ab_baseline,
                ab_config={})
    return dict(row, metric="ab_ratio", value=ratio, p20=ratio * 0.9, p80=ratio * 1.1, tflops=None, n_pairs=50,
                **extra)


def test_switch_speedups_prefer_interleaved_ab_rows(tmp_path):
    rows = []
    for s in (4096, 8192):  # medians: no_pingpong 0.8x of full (switch 1.25x), two_cta 1.05x (switch 1.05x)
        rows += [_attn("fa4", "full", "fwd", 128, 128, False, s, 600.0, config={}),
                 _attn("fa4", "no_pingpong", "fwd", 128, 128, False, s, 480.0, config={"pingpong": False}),
                 _attn("fa4", "full", "bwd", 128, 128, False, s, 450.0, config={}),
                 _attn("fa4", "two_cta", "bwd", 128, 128, False, s, 472.5, config={"two_cta": True})]
    # A/B rows disagree with the medians; only seqlen 8192 has them
    rows += [_ab("no_pingpong", "fwd", 8192, 0.5, {"pingpong": False}),  # t_full / t_variant = 0.5: switch 2x
             _ab("two_cta", "bwd", 8192, 1.2, {"two_cta": True}),  # two_cta on is 1.2x faster
             _ab("no_pingpong", "fwd", 4096, 0.1, {"pingpong": False}, ab_baseline="tau0"),  # another baseline
             _ab("no_pingpong", "fwd", 4096, 0.1, {"pingpong": False}, status="fail"),
             _ab("no_pingpong", "fwd", 4096, 0.1, {"pingpong": False}, gpu_name=None),  # a CPU run
             _ab("no_exp2_emu", "fwd", 8192, 0.5, {"exp2_emu_fraction": 0.0})]  # sm90 default: the same kernel
    s = A.switch_speedups(pd.DataFrame(rows)).set_index(["switch", "seqlen_q"])
    pp, cta = s.loc[("pingpong", 8192)], s.loc[("2-CTA (on)", 8192)]
    assert pp["basis"] == "ab_ratio" and pp["speedup"] == pytest.approx(2.0)
    assert (pp["lo"], pp["hi"]) == pytest.approx((1 / 0.55, 1 / 0.45))
    assert cta["basis"] == "ab_ratio" and cta["speedup"] == pytest.approx(1.2)
    assert (cta["lo"], cta["hi"]) == pytest.approx((1.08, 1.32))
    # the cell without (usable) A/B rows keeps the medians
    assert s.loc[("pingpong", 4096), "basis"] == "medians"
    assert s.loc[("pingpong", 4096), "speedup"] == pytest.approx(1.25)
    assert s.loc[("2-CTA (on)", 4096), "speedup"] == pytest.approx(1.05)
    assert "exp2 emulation" not in s.index.get_level_values("switch")
    assert len(s) == 4
    # A/B rows alone (no separately timed rows) are enough
    only = A.switch_speedups(pd.DataFrame(rows[8:]))
    assert set(only["basis"]) == {"ab_ratio"} and len(only) == 2
    _png(A.ablation_figure(pd.DataFrame(rows), tmp_path))


def test_round_robin_rows_replace_separately_timed_ones_cell_by_cell():
    base = dict(kind="attn", metric="time_ms", status="ok", gpu_name=GPU, tflops=1.0, value=1.0, mode="fwd", hdim=128,
                hdim_v=128, causal=False, seqlen_q=8, seqlen_k=8, batch=1, heads=1, backend="fa4", variant="default")
    d = S.attn_times(pd.DataFrame([base, dict(base, kind="compare", tflops=2.0), dict(base, seqlen_q=16, seqlen_k=16)]))
    assert sorted(zip(d["kind"], d["seqlen_q"])) == [("attn", 16), ("compare", 8)]


def test_ratio_rows_keep_each_entry_from_its_latest_job():
    """A re-run compare job that left a peer out replaces the ratios it timed and keeps the left-out peer's ratio from
    the job before; the figures' timed rows still come from the shape's latest job alone."""
    base = dict(kind="attn", status="ok", gpu_name=GPU, mode="bwd", hdim=128, hdim_v=128, causal=False, seqlen_q=8192,
                seqlen_k=8192, batch=2, heads=16, baseline="fa4", baseline_variant="default", experiment="bwd_peers")
    old = dict(base, job_key="j", run_id="old", time="2026-12-01T00:00:00Z")
    new = dict(base, job_key="j2", run_id="new", time="2026-12-03T00:00:00Z")
    rows = [dict(old, metric="time_ratio", backend="fa4_official", variant="peer", value=1.10),
            dict(old, metric="time_ratio", backend="flex", variant="peer", value=1.60),
            dict(new, metric="time_ratio", backend="fa4_official", variant="peer", value=1.02),
            dict(old, metric="time_ms", backend="flex", variant="peer", value=2.0, tflops=300.0, rr_entries="fa4,flex"),
            dict(new, metric="time_ms", backend="fa4", variant="default", value=1.0, tflops=600.0,
                 rr_entries="fa4,fa4_official")]
    rr = S.ratio_rows(pd.DataFrame(rows)).set_index("backend")["value"]
    assert rr.to_dict() == {"fa4_official": 1.02, "flex": 1.60}
    assert list(S.attn_times(pd.DataFrame(rows))["backend"]) == ["fa4"]  # one shape, one job


def test_ratio_rows_keep_an_entry_without_a_variant():
    """The matmul reference's ratio rows have no variant (NaN in a frame with peers): pandas' str dtype keeps NaN
    through astype(str), which once dropped those rows from every target (the fwd_gemm cell read untimed)."""
    base = dict(kind="attn", status="ok", gpu_name=GPU, mode="fwd", hdim=128, hdim_v=128, causal=False, seqlen_q=16384,
                seqlen_k=16384, batch=2, heads=16, baseline="fa4", baseline_variant="default", experiment="fwd_gemm",
                job_key="j", run_id="r", time="2026-12-04T00:00:00Z", metric="time_ratio")
    rows = [dict(base, backend="sdpa_cudnn", variant="peer", value=1.1), dict(base, backend="matmul_ref", value=0.86)]
    rr = S.ratio_rows(pd.DataFrame(rows)).set_index("backend")["value"]
    assert rr.to_dict() == {"sdpa_cudnn": 1.1, "matmul_ref": 0.86}


def test_numerics_figure_counts_nan_outputs_as_failures(tmp_path):
    rows = []
    for tau, ratio, nan in ((0.0, 0.5, 0.0), (8.0, 0.6, 0.0), (20.0, None, 12.0)):
        for m, v in (("out_err_ratio", ratio), ("skipped_share", tau / 20), ("n_nan", nan), ("n_inf", 0.0)):
            rows.append(dict(kind="numerics", status="ok", metric=m, value=v, dist="fp16_overflow", dtype="float16",
                             hdim=128, tau=tau, exp2_fraction=0.0, job_key=f"j{tau}"))
    w = N.numerics_worst(pd.DataFrame(rows))
    assert list(w["failed"]) == [False, False, True] and w["ratio"].iloc[:2].tolist() == [0.5, 0.6]
    path, msg = N.numerics_figure(pd.DataFrame(rows), tmp_path)
    assert path.exists() and "1 NaN/inf cases drawn as failures" in msg


def test_round_robin_rows_win_and_coverage_says_so():
    """A compare job's rows (kind 'attn' with rr_entries) replace the separately timed rows of their shape in the
    figures' data (also of a backend the job did not time: one shape, one job), and the coverage table marks that
    cell 'rr' with the backends of the round-robin job."""
    base = dict(kind="attn", metric="time_ms", status="ok", mode="bwd", hdim=128, hdim_v=128, causal=False,
                seqlen_k=8192, batch=2, heads=16, variant="default", gpu_name="H200", tflops=500.0)
    rows = [dict(base, seqlen_q=8192, backend="fa4", tflops=380.0),  # separate jobs, older
            dict(base, seqlen_q=8192, backend="fa4_official", tflops=675.0),
            dict(base, seqlen_q=8192, backend="sdpa_cudnn", tflops=590.0),
            dict(base, seqlen_q=8192, backend="fa4", tflops=550.0, rr_entries="fa4,fa4_official"),
            dict(base, seqlen_q=8192, backend="fa4_official", tflops=680.0, rr_entries="fa4,fa4_official"),
            dict(base, seqlen_q=4096, seqlen_k=4096, backend="fa4", tflops=400.0)]
    df = pd.DataFrame(rows)
    d = S.attn_times(df)
    cell = d[d["seqlen_q"] == 8192]
    # ours and official FA4 keep only their round-robin rows; cuDNN, timed only separately, goes too
    assert sorted(cell["tflops"]) == [550.0, 680.0]
    other = d[d["seqlen_q"] == 4096]
    assert list(other["tflops"]) == [400.0]  # a shape without a round-robin job keeps its separate rows
    # another experiment's round-robin job of the same shape drops only the rows of the backends it timed
    moved = pd.DataFrame([dict(r, experiment="bwd_ablation" if r.get("rr_entries") else "bwd_peers") for r in rows])
    assert sorted(S.attn_times(moved).query("seqlen_q == 8192")["tflops"]) == [550.0, 590.0, 680.0]
    cov = T.coverage(df).set_index(["mode", "head dim", "causal"])
    # '‡': these rows carry no throttled share / git SHA; '°': no round count
    assert cov.loc[("bwd", "128", "no"), "8k"] == "fa4 +1 rr°‡" and cov.loc[("bwd", "128", "no"), "4k"] == "fa4 +0 sep‡"
    # every cell of the paper grid is listed, '-' where there are no rows
    assert len(cov) == 16 and cov.loc[("fwd", "192/128", "yes"), "32k"] == "-"
    assert T.coverage_summary(T.coverage(df)) == ("fwd: 0 of 48 cells timed (0 round-robin); "
                                                  "bwd: 2 of 48 cells timed (1 round-robin)")


def _capture(monkeypatch):
    """Every figure a figure module saves, kept for inspection (save_png still writes it)."""
    from analysis import style

    figs = []

    def keep(plt, fig, out, note="", bottom=0.0):
        figs.append((fig, note))
        return style.save_png(plt, fig, out, note, bottom)

    for mod in (P, A, R, N):
        monkeypatch.setattr(mod, "save_png", keep)
    return figs


@pytest.mark.parametrize("fn", [P.fig4, P.fig5, P.fig6, P.fig7, P.fig8, A.ablation_figure, A.waterfall_figure,
                                lambda d, o: A.sweep_figure(d, o, "rescale_threshold"),
                                lambda d, o: A.sweep_figure(d, o, "exp2_emu_fraction"),
                                lambda d, o: R.roofline_figure(d, o, calib={}), R.microbench_figure])
def test_gpu_figures_state_provenance_keep_legends_off_the_data_and_never_pool_head_dims(df, tmp_path, monkeypatch,
                                                                                       fn):
    import re

    figs = _capture(monkeypatch)
    _png(fn(df, tmp_path))
    (fig, note), = figs
    assert note.startswith(GPU) and "throttl" in note, note  # the GPU and its throttled share (or that it is unknown)
    if fn is not R.microbench_figure:  # attention rows: their date and samples per point too
        assert re.search(r"; 2026-11-30; 10 samples per point \(separately timed jobs\); ", note), note
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        assert ax.get_legend() is None, ax.get_title()  # one legend for the figure, below the panels
        hds = re.findall(r"hdim (\d+(?:/\d+)?)", ax.get_title())
        assert len(hds) <= 1, ax.get_title()  # a panel never pools head dims
        lo, hi = ax.get_ylim()
        if "TFLOP/s" in ax.get_ylabel() and ax.get_yscale() == "linear" or "exp2 per clock" in ax.get_ylabel():
            assert lo == 0, (ax.get_title(), lo)  # throughput from 0
        if "speedup" in ax.get_ylabel():  # a speedup axis: the noise band drawn, or at least 0.9x..1.1x
            band = any(type(c).__name__ in ("Polygon", "Rectangle") and c.get_facecolor()[:3] != (1, 1, 1)
                       for c in ax.patches)
            assert band or (lo <= 0.9 and hi >= 1.1), (ax.get_title(), lo, hi)


def test_roofline_figure_has_a_panel_per_head_dim(df, tmp_path, monkeypatch):
    figs = _capture(monkeypatch)
    R.roofline_figure(df, tmp_path, calib={})
    titles = [ax.get_title() for ax in figs[0][0].axes]
    assert sum(t.startswith("hdim 128:") for t in titles) == 2 and sum(t.startswith("hdim 192/128:") for t in titles) == 2


def test_numerics_legends_sit_beside_the_data(tmp_path, monkeypatch):
    figs = _capture(monkeypatch)
    rows = []
    for tau in (0.0, 8.0):
        for m, v in (("out_err_ratio", 0.5), ("skipped_share", tau / 10)):
            rows.append(dict(kind="numerics", status="ok", metric=m, value=v, dist="normal", dtype="bfloat16",
                             hdim=128, tau=tau, exp2_fraction=0.0, job_key=f"j{tau}"))
    N.numerics_figure(pd.DataFrame(rows), tmp_path)
    for ax in figs[0][0].axes:
        leg = ax.get_legend()
        if leg is not None:
            anchor = leg.get_bbox_to_anchor().transformed(ax.transAxes.inverted())
            assert anchor.x0 >= 1.0  # to the right of the axes


def test_provenance_note_says_what_the_rows_lack():
    row = dict(gpu_name=GPU, time="2026-11-30T10:00:00+00:00", n=10, kind="attn", rr_entries=["fa4", "flex"],
               throttled_share=0.5, git_sha="abc")
    assert S.provenance_note(pd.DataFrame([row])) == ("NVIDIA H200; 2026-11-30; 10 samples per point (round-robin); "
                                                      "throttled: 50% of GPU samples; committed sets")
    mixed = S.provenance_note(pd.DataFrame([row, dict(row, throttled_share=None, git_sha=None, rr_entries=None)]))
    assert "(mixed methods)" in mixed and "(1 of 2 rows without it)" in mixed and "git SHA missing on 1 of 2 rows" in mixed


def test_backward_figures_have_a_panel_for_every_head_dim_with_rows(df, tmp_path, monkeypatch):
    figs = _capture(monkeypatch)
    P.fig6(df, tmp_path)
    titles = [ax.get_title() for ax in figs[0][0].axes]
    assert titles == ["non-causal, hdim 128", "causal, hdim 128", "non-causal, hdim 192/128", "causal, hdim 192/128"]
    wide = df[(df["hdim"] == 192) & (df["backend"] == "fa4")].assign(variant="deterministic",
                                                                     **{"config.deterministic": True})
    P.fig7(pd.concat([df, wide], ignore_index=True), tmp_path)
    assert [ax.get_title() for ax in figs[1][0].axes] == ["causal, hdim 128", "causal, hdim 192/128"]


def test_a_bar_never_pools_two_experiments(tmp_path, monkeypatch):
    """The official FA4 timed in fwd_peers and again as a peer in fwd_ablation at one shape: Fig. 4 draws the peers
    experiment's row only."""
    base = _attn("fa4_official", "peer", "fwd", 128, 128, False, 8192, 700.0, rr_entries=["fa4", "fa4_official"],
                 throttled_share=0.1, git_sha="abc")
    rows = [dict(base, experiment="fwd_peers"), dict(base, experiment="fwd_ablation", tflops=500.0),
            dict(base, backend="fa4", variant="default", experiment="fwd_peers", tflops=690.0)]
    figs = _capture(monkeypatch)
    path, msg = P.fig4(pd.DataFrame(rows), tmp_path)
    assert "(2 rows)" in msg
    (ax,) = figs[0][0].axes
    assert sorted(round(b.get_height()) for b in ax.patches if b.get_height() > 0) == [690, 700]
