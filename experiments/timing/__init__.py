"""Timing that keeps comparisons fair on a shared, power-capped GPU: the NVML sampler thread (sampler.py), the
settle step and the round-robin timer (roundrobin.py). experiments/bench.py keeps the single-function timer."""
