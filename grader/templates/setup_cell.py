# Set-up. In Google Colab this installs the course's helper package (course_utils) from the
# course's student edition; in JupyterLab or VS Code with the course environment it installs nothing.
# Everywhere, it says in one line if this kernel's PyTorch is too old for this notebook.
import sys

if "google.colab" in sys.modules:
    import os
    import subprocess

    # COURSE_UTILS_FROM may name another source for pip (a folder, a wheel, a URL).
    source = os.environ.get("COURSE_UTILS_FROM", "git+{student_edition_url}")
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", source], capture_output=True, text=True)
    if pip.returncode != 0:
        reason = ([line for line in pip.stderr.splitlines() if line.strip()] or ["pip failed"])[-1].strip()
        raise SystemExit(f"Could not install course_utils from {source} ({reason}). Check that this "
                         f"session is online, then run this cell again; if it still fails, tell your instructor.")
    print("course_utils installed from", source)

from course_utils.versions import require

require("{notebook}")
