# Set-up. In Google Colab this installs the course's helper package (course_utils) from the
# course's student edition; in JupyterLab or VS Code with the course environment it does nothing.
import sys

if "google.colab" in sys.modules:
    import subprocess

    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "git+{student_edition_url}"], check=True)
