import sys, torch
sys.path.insert(0, "tests")
from kernels.config import AttnConfig
from test_fwd_loop_shape_gpu import _run, same_up_to_rounding
from test_fwd_speculative_exp_gpu import rare_arm_inputs
for hdim in (64, 128):
    for causal in (False, True):
        q, k, v = rare_arm_inputs(hdim)
        ref = _run(AttnConfig(speculative_exp=True), q, k, v, causal, hdim, hdim)
        got = _run(AttnConfig(speculative_exp=True, p_before_vote=True), q, k, v, causal, hdim, hdim)
        eag = _run(AttnConfig(), q, k, v, causal, hdim, hdim)
        torch.cuda.synchronize()
        d = (got[0].float() - ref[0].float()).abs()
        de = (ref[0].float() - eag[0].float()).abs()
        print(hdim, causal, "pbv-vs-spec max", d.max().item(), "frac", (d > 0).float().mean().item(),
              "lse max", (got[1] - ref[1]).abs().max().item(), "| spec-vs-eager max", de.max().item(),
              "frac", (de > 0).float().mean().item(), flush=True)
        try:
            same_up_to_rounding(got, ref, "x"); print("  within rounding")
        except AssertionError as e:
            print("  NOT within rounding", str(e)[:200])
