"""The benchmark: correctness before timing, FLOPs and peaks, the runner."""
