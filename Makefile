# One command to set up and run the course, one to set up and pass the tests.
#   make lab        set up .venv on first use, then start JupyterLab in notebooks/ and print its URL
#                   [PORT=8888]
#   make test       set up .venv on first use, then every check CI runs but the Colab stand-in
#   make test-colab the Colab stand-in under Python 3.12 and PyPI's torch, as Colab has them (CI runs it
#                   after make test; downloads about 3 GB into .venv-colab on first use) [COLAB_PY=...]
#   make test-torch-floor  the Colab stand-in with the oldest torch pyproject.toml admits (2.5.0)
#   make test-gradescope  Gradescope's container played here: setup.sh from nothing, then run_autograder
#                   where bubblewrap cannot start (CI runs it after make test; about 8 minutes)
# Instructors:
#   make build      solutions/src/*.py -> solutions/*.ipynb, executed from a clean kernel, and the
#                   checks' expected outputs recorded into course_utils/expected/
#   make release    solutions/ -> notebooks/ (student versions, hidden tests removed), then the student
#                   edition in release/ (what students get; scanned for answers) [NOTEBOOKS="01 02"]
#   make autograde SUBMISSIONS=path/to/submissions-or-LMS-download [OUT=grading] [WORKERS=2]
#                   [LAYOUT=canvas|moodle|nbgrader|folders] [GRADER_ARGS="--export canvas --roster roster.csv"]
#   make feedback  [OUT=grading]
# Maintainers:
#   make bench      attention benchmark on whatever device is present (bench-results/) [BENCH_ARGS=...]
#   make bench-grader  grading throughput, each self-check's time, copy detection on a class of 200
#                   (speed targets are printed here, never asserted by a test)
#   make lock       re-resolve constraints.txt (exact versions) from pyproject.toml

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
OUT ?= grading
WORKERS ?= 2
PORT ?= 8888
ARTIFACTS := test-artifacts/browser

.PHONY: setup lab test test-colab test-torch-floor test-gradescope test-tools build release check-release autograde feedback bench bench-grader lock sandbox clean

# pip first becomes PIP_VERSION: the pip a Python 3.11 venv starts with (23.2) spends 30 CPU-s choosing among
# the 84,000 files PyPI lists for these packages, 26.3 spends 12 (2026-11-29; the whole install: 66 s -> 42 s).
# pip compiles what it installs one file at a time (about 35 CPU-s here); compileall does it on every core. The
# compiled files must exist: a sandboxed kernel cannot write them into the environment, and would compile
# torch again at every start. Not compiled: the packages' own test folders and pip, which no kernel, grader or
# test imports (a fifth of the files: 13 of 53 CPU-s here).
PIP_VERSION := 26.3
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check pip==$(PIP_VERSION)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-compile -c constraints.txt -e ".[dev]"
	$(BIN)/python -m compileall -q -j 0 -x '/site-packages/(pip/|.*/tests?/)' \
	  $$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') >/dev/null 2>&1 || true
	touch $(STAMP)

setup: $(STAMP)

# scripts/lab.py prints the URL with its token, stops with a clear message if PORT is taken, and
# adds --allow-root when run as root. The browser tests start JupyterLab with the same script.
lab: setup
	@$(BIN)/python scripts/lab.py --notebook-dir notebooks --port $(PORT)

# bubblewrap sandboxes student code during autograding; install it where it is missing and we can.
sandbox:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing bubblewrap (sandbox for student code)"; \
	    (apt-get update -qq && apt-get install -y -qq bubblewrap) >/dev/null; \
	  else \
	    echo "bubblewrap (bwrap) is not installed and cannot be installed here: install it with your package manager"; \
	  fi; }

# Everything make test needs from the system, installed in one apt-get call where it is missing and
# we can (root with apt-get): bubblewrap (the grader's sandbox), chromium and an emoji font (browser
# tests), postgresql (the gradebook server test). Elsewhere: a message, and those tests skip saying why.
test-tools:
	@missing=""; \
	command -v bwrap >/dev/null 2>&1 || missing="$$missing bubblewrap"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium fonts-noto-color-emoji"; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing$$missing (sandbox, browser tests, gradebook server)"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing) \
	      >/dev/null 2>&1 || echo "apt-get could not install$$missing: the tests that need them skip and say why"; \
	  else \
	    echo "not installed:$$missing; install them with your package manager, or the tests that need them skip"; \
	  fi; \
	fi

# pytest on TEST_WORKERS processes (conftest.py and tests/conftest.py say how files are shared out), each of whose
# kernels computes on one thread: two processes of two spinning threads each on two cores are slower.
# The course environment (pip) and the system packages (apt-get) install side by side: one waits on
# the network and the disk while the other computes.
# The course's own code is compiled once, before the tests: where PYTHONDONTWRITEBYTECODE is set (as on
# some CI machines), every kernel and grader process would otherwise compile it anew (about 0.1 s each).
# The Colab stand-in (tests/release/test_colab.py) runs under Colab's own Python and torch, in make
# test-colab (CI runs it right after), not a second time here under the course's Python 3.11. Gradescope's
# container (tests/grader_messy/test_gradescope_container.py: setup.sh installs a whole environment) is
# left to make test-gradescope, which CI also runs right after.
TEST_WORKERS ?= 2
test:
	@$(MAKE) --no-print-directory -j2 setup test-tools
	@$(BIN)/python -m compileall -q -j 0 course_utils grader scripts tests >/dev/null
	@echo "browser tests save their screenshots in $(ARTIFACTS)/"
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
	  --ignore=tests/release/test_colab.py --ignore=tests/grader_messy/test_gradescope_container.py

test-gradescope: setup
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest tests/grader_messy/test_gradescope_container.py -p no:randomly -q

# The Colab stand-in (tests/release/test_colab.py) in another environment than the course's, built once:
#   make test-colab        Colab's Python (3.12) and PyPI's torch 2.13.0, a CUDA build as Colab has
#                          (about 3 GB); CI runs it after make test
#   make test-torch-floor  the oldest torch pyproject.toml admits (2.5.0, with the Triton it brings), on
#                          the course's Python; the student edition with the solution's answers too
# Only numpy, matplotlib, tqdm and ipykernel keep the course's pins: torch brings its own Triton, sympy...
COLAB_PY ?= $(shell for p in python3.12 $$HOME/.pyenv/versions/3.12*/bin/python3.12; do \
  $$p -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null && { command -v $$p; break; }; done)
COLAB_TORCH ?= 2.13.0
COLAB_VENV ?= .venv-colab
COLAB_STAMP := $(COLAB_VENV)/.installed-torch-$(COLAB_TORCH)
COLAB_TESTS ?= tests/release/test_colab.py
TORCH_FLOOR := 2.5.0

$(COLAB_STAMP): constraints.txt
	@[ -n "$(COLAB_PY)" ] || { echo "make test-colab needs Python 3.12 (python3.12 on PATH, or COLAB_PY=/path/to/python3.12)"; exit 2; }
	@echo "building $(COLAB_VENV): $$($(COLAB_PY) --version), torch $(COLAB_TORCH) from PyPI"
	rm -rf $(COLAB_VENV)
	$(COLAB_PY) -m venv $(COLAB_VENV)
	grep -E '^(numpy|matplotlib|tqdm|ipykernel)==' constraints.txt > $(COLAB_VENV)/constraints.txt
	$(COLAB_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -c $(COLAB_VENV)/constraints.txt \
	  torch==$(COLAB_TORCH) numpy matplotlib tqdm ipykernel
	touch $(COLAB_STAMP)

test-colab: setup $(COLAB_STAMP)
	@$(COLAB_VENV)/bin/python -c "import platform, torch; print('Colab stand-in: Python', platform.python_version(), 'torch', torch.__version__)"
	COURSE_STUDENT_PYTHON=$(abspath $(COLAB_VENV))/bin/python OMP_NUM_THREADS=1 $(BIN)/python -m pytest \
	  $(COLAB_TESTS) -p no:randomly -q

test-torch-floor:
	@$(MAKE) --no-print-directory test-colab COLAB_PY=$(PYTHON) COLAB_TORCH=$(TORCH_FLOOR) COLAB_VENV=.venv-torch-floor \
	  COLAB_TESTS="tests/release/test_colab.py tests/release/test_editions.py"

build: setup
	$(BIN)/python -m grader build $(NOTEBOOKS)

release: setup
	$(BIN)/python -m grader release $(NOTEBOOKS)

check-release: setup
	$(BIN)/python -m grader check-release

autograde: setup sandbox
	@test -n "$(SUBMISSIONS)" || { echo "usage: make autograde SUBMISSIONS=path/to/submissions [OUT=grading] [WORKERS=2]"; exit 2; }
	$(BIN)/python -m grader autograde "$(SUBMISSIONS)" --out "$(OUT)" --workers $(WORKERS) \
	  $(if $(LAYOUT),--layout $(LAYOUT)) $(GRADER_ARGS)

feedback: setup
	$(BIN)/python -m grader feedback "$(OUT)"

# BENCH_ARGS, e.g. "--threads 1" (steadier CPU timings on a shared machine) or "--seq-lens 512 1024 2048".
bench: setup
	$(BIN)/python -m course_utils.bench --out bench-results $(BENCH_ARGS)

bench-grader: setup
	$(BIN)/python scripts/bench_grader.py
	$(BIN)/python scripts/bench_checks.py

lock:
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/python -m pip install --quiet --disable-pip-version-check pip==$(PIP_VERSION)
	.lock-venv/bin/python -m pip install --quiet torch==2.13.0 -e ".[dev]"
	{ sed -n '1,3p' constraints.txt; .lock-venv/bin/python -m pip freeze --exclude-editable | sed 's/+cpu$$//'; } > constraints.new
	mv constraints.new constraints.txt && rm -rf .lock-venv

clean:
	rm -rf $(VENV) grading bench-results release .pytest_cache test-artifacts
