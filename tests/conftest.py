import matplotlib

# Figures drawn by notebook code run in this process (tests/harness.py) go nowhere. Only this
# process: setting MPLBACKEND in the environment would leak into the kernels nbval starts, and
# their figure outputs would no longer match the stored ones.
matplotlib.use("Agg")

# tests/submissions/ holds deliberately broken student files for the grader's tests; they are
# data, not notebooks for nbval to execute.
collect_ignore_glob = ["submissions/*"]
