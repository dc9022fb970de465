"""Issue 13.2: run.py checks the composed config before any job runs: exit 2, one line naming the key, the
bad value and what is allowed; no rows are written."""
from __future__ import annotations

import pytest

import run
from experiments.config_check import RunConfigError, check_bench, check_grid

pytestmark = pytest.mark.filterwarnings("ignore:(?s).*validated against ConfigStore schema:UserWarning")

CASES = [
    (["check", "bench.repeats=abc"], "error: bench.repeats='abc': must be an int >= 1"),
    (["bench", "bench.warmup=-1"], "error: bench.warmup=-1: must be an int >= 0"),
    (["check", "bench.hold_us=-5"], "error: bench.hold_us=-5: must be a number >= 0"),
    (["check", "bench=stream", "bench.stream_calls=-1"], "error: bench.stream_calls=-1: must be an int >= 0"),
    (["check", "modes=[fwd,xyz]"], "error: modes=['fwd', 'xyz']: must be a non-empty list of fwd, bwd"),
    (["check", "isolation=threads"], "error: isolation='threads': supported: auto, process, inline"),
    (["check", "job_timeout_s=0"], "error: job_timeout_s=0: must be a number of seconds > 0"),
    (["check", "retry_failed=maybe"], "error: retry_failed='maybe': must be true or false"),
    (["check", "shape=cpu", "shape.grid.seqlens=[0]"],
     "error: shape.grid.seqlens=[0]: must be a non-empty list of ints >= 1"),
    (["sweep", "experiment=fwd_peers", "shape.grid.total_tokens=0"],
     "error: shape.grid.total_tokens=0: must be an int >= 1"),
    (["sweep", "experiment=fwd_ablation", "experiment.modes=[fwd,back]"],
     "error: experiment.modes=['fwd', 'back']: must be a non-empty list of fwd, bwd"),
    (["check", "backend=fa4", "backend.config.bogus=1"],
     "error: backend.config.bogus: unknown key; keys of backend.config: rescale_threshold, exp2_emu_fraction"),
    (["check", "backend=fa4", "+backend.config.bogus=1"],
     "error: backend.config: unknown AttnConfig field 'bogus'; fields: rescale_threshold, exp2_emu_fraction"),
    (["check", "backend=fa4", "backend.config.rescale_threshold=-1"],
     "error: backend.config: rescale_threshold=-1: must be a number in [0, 64]"),
    (["check", "backend=reference", "backend.config.tile_m=64"],
     "error: backend.config.tile_m: unknown key; backend.config is null with these choices "
     "(this backend takes no AttnConfig)"),
    (["check", "bench.bogus=1"], "error: bench.bogus: unknown key; keys of bench: repeats, warmup, flush_l2"),
    (["check", "bogus=1"], "error: bogus: unknown key; keys of the top level: cmd, results_dir, isolation"),
    (["sweep", "experiment=numerics", "+experiment.params.taus=[a]"], "error: experiment 'numerics': taus:"),
    (["bench", "shape=cpu,small", "bench.repeats=0"], "error: bench.repeats=0: must be an int >= 1"),  # multirun
]


@pytest.mark.parametrize("argv, start", CASES, ids=[" ".join(a[1:]) for a, _ in CASES])
def test_bad_value_is_one_line_before_any_job(argv, start, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        run.main([*argv, f"results_dir={tmp_path}", f"hydra.run.dir={tmp_path}/hydra"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(start), err
    assert not list(tmp_path.rglob("*.jsonl"))


def test_checks_directly():
    check_bench("bench", {"repeats": 3, "warmup": 0, "flush_l2": False, "max_time_s": 2.5})
    check_grid({"total_tokens": 256, "hidden": 128, "hdims": [64, [192, 128]], "seqlens": [64], "causal": [True]})
    with pytest.raises(RunConfigError, match=r"^bench.max_time_s=-1: must be null"):
        check_bench("bench", {"max_time_s": -1})
    with pytest.raises(RunConfigError, match=r"^shape.grid.hdims=\[\[64\]\]: must be"):
        check_grid({"hdims": [[64]]})
    with pytest.raises(RunConfigError, match=r"^shape.grid.dtype='fp8': supported: bfloat16, float16"):
        check_grid({"dtype": "fp8"})
