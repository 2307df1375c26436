# Set-up. In Google Colab this installs the course's helper package (course_utils) from the
# course repository; in JupyterLab or VS Code with the course environment it does nothing.
import sys

if "google.colab" in sys.modules:
    import subprocess

    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "git+{repository_url}"], check=True)
