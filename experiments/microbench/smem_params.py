"""Sizes of the shared-memory bandwidth microbenchmark, shared by its driver (smem_cute.py) and kernel (_smem_kernel.py)."""
THREADS = 512
VEC = 4  # fp32 per 16-byte load
UNROLL = 8  # loads per thread per iteration
WINDOW = THREADS * VEC * UNROLL  # fp32 words read per iteration by the CTA (64 KiB)
BUF = 2 * WINDOW  # the window slides over [0, BUF)
