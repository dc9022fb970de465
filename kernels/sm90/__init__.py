"""Hopper (sm_90a) CuTe DSL kernels: forward (fwd.py) and the shared device pieces (exp2, softmax, mask, scheduler)."""
