#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (Ubuntu). It installs:
#   - a released Python {floor} or newer (the system's, Ubuntu's package, or uv's managed build), or stops;
#   - a virtual environment at $ROOT/venv with requirements.txt (what the grader imports, exact
#     versions from constraints.txt; the CPU build of PyTorch);
#   - the student edition of course_utils at $ROOT/student (what the student's kernel may import);
#   - the user {kernel_user}, as whom the student's kernel runs where bubblewrap cannot (Gradescope).
# $AUTOGRADER_ROOT points it at another root than /autograder (the course's tests);
# $GRADER_TORCH_INDEX at another index for PyTorch's CPU build ("" for none: PyPI and pip's own settings).
set -euo pipefail
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
SOURCE="$ROOT/source"
VENV="$ROOT/venv"
KERNEL_USER="{kernel_user}"
TORCH_INDEX="${{GRADER_TORCH_INDEX-https://download.pytorch.org/whl/cpu}}"
export DEBIAN_FRONTEND=noninteractive

say() {{ echo "setup.sh: $*"; }}
die() {{ echo "setup.sh: ERROR: $*" >&2; exit 1; }}

# Only what is missing is installed, so a prepared image (or the course's test) needs no network.
missing=()
command -v setpriv >/dev/null 2>&1 || missing+=(util-linux)
command -v prlimit >/dev/null 2>&1 || missing+=(util-linux)
command -v useradd >/dev/null 2>&1 || missing+=(passwd)
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
if [ "${{#missing[@]}}" -gt 0 ]; then
  say "installing ${{missing[*]}}"
  apt-get update -qq && apt-get install -y -qq "${{missing[@]}}" >/dev/null || die "apt-get could not install ${{missing[*]}}"
fi

# A released Python (sys.version_info.releaselevel == 'final') of {floor} or newer, with venv: Ubuntu
# 22.04's python3.11 package is a release candidate, 3.10 cannot install the course, and the pinned
# versions need {floor} (grader.gradescope.PYTHON_FLOOR).
released() {{
  "$1" -c 'import sys, venv, ensurepip; sys.exit(not (sys.version_info >= {floor_tuple} and sys.version_info.releaselevel == "final"))' \
    >/dev/null 2>&1
}}
find_python() {{
  local name exe
  for name in ${{GRADER_SETUP_PYTHON:-}} python3.13 python3.12 python3.11 python3; do
    exe="$(command -v "$name" 2>/dev/null)" || continue
    if released "$exe"; then echo "$exe"; return 0; fi
  done
  return 1
}}
tried="the Pythons on PATH"
PY="$(find_python)" || {{
  tried="$tried, Ubuntu's python3.12 and python3.11 packages"
  apt-get update -qq >/dev/null 2>&1 || true
  for version in 3.12 3.11; do
    apt-get install -y -qq "python$version" "python$version-venv" >/dev/null 2>&1 || true
  done
  PY="$(find_python)"
}} || {{
  # uv's managed Python, installed where the kernel's user can read it ($ROOT/python).
  tried="$tried, uv's managed Python 3.11"
  apt-get install -y -qq python3-venv >/dev/null 2>&1 || true
  if python3 -m venv "$ROOT/uv" >/dev/null 2>&1 && "$ROOT/uv/bin/python" -m pip install --quiet uv; then
    UV_PYTHON_INSTALL_DIR="$ROOT/python" "$ROOT/uv/bin/uv" python install 3.11 >/dev/null 2>&1 || true
    exe="$(UV_PYTHON_INSTALL_DIR="$ROOT/python" "$ROOT/uv/bin/uv" python find --python-preference only-managed 3.11 2>/dev/null)" || exe=""
    if [ -n "$exe" ] && released "$exe"; then PY="$exe"; fi
  fi
  [ -n "${{PY:-}}" ]
}} || die "no released Python {floor} or newer could be had (tried $tried). Choose a newer Ubuntu as the base image in Gradescope's Autograder Settings, or install one in this script."
say "Python: $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])'))"

rm -rf "$VENV"
"$PY" -m venv "$VENV"
extra=()
[ -n "$TORCH_INDEX" ] && extra=(--extra-index-url "$TORCH_INDEX")
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
  -r "$SOURCE/requirements.txt" -c "$SOURCE/constraints.txt" "${{extra[@]}}" \
  || die "pip could not install $SOURCE/requirements.txt"
# The grader's own imports, and the kernel's, checked now rather than at the first submission.
(cd "$SOURCE" && "$VENV/bin/python" -c 'import grader.gradescope, grader.autograde, grader.runas, ipykernel, course_utils.checks') \
  || die "the grader cannot import what it needs with $VENV"

# The student edition, outside source/ (which only root may read), readable by everyone.
rm -rf "$ROOT/student"
cp -r "$SOURCE/student" "$ROOT/student"
chmod -R u=rwX,go=rX "$ROOT/student" "$VENV"
[ -d "$ROOT/python" ] && chmod -R go+rX "$ROOT/python"

if ! id -u "$KERNEL_USER" >/dev/null 2>&1; then
  useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$KERNEL_USER" \
    || die "could not create the user $KERNEL_USER"
fi
chmod 0755 "$ROOT"
chmod 0700 "$SOURCE"
say "ready: Python $("$VENV/bin/python" -c 'import sys; print(sys.version.split()[0])'), kernel user $KERNEL_USER ($(id -u "$KERNEL_USER"))"
