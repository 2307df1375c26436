"""What reaches students: released notebooks, the student edition, Colab, and the student's JupyterLab in a real browser."""
