import matplotlib

# Figures drawn by notebook code run in this process (tests/harness.py) go nowhere. Only this
# process: setting MPLBACKEND in the environment would leak into the kernels nbval starts, and
# their figure outputs would no longer match the stored ones.
matplotlib.use("Agg")
