"""fa4lab experiments: backends (ours, the reference, the peers), correctness check, timing, job runners."""
