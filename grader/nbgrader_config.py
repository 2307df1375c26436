"""nbgrader configuration shared by ``python -m grader`` and by instructors who run nbgrader directly.

``python -m grader`` loads this file, then sets ``CourseDirectory.root`` to its own working
folder. To use the nbgrader command line or the formgrader by hand, copy this file into the
course folder that nbgrader works in (the course's package must be installed: the values come
from ``grader.config.SETTINGS``, the one place they are kept).
"""

from grader.config import SETTINGS

c = get_config()  # noqa: F821 - provided by traitlets when the file is loaded

c.CourseDirectory.course_id = SETTINGS.course_id
# Each notebook of the course is one assignment holding one notebook.
c.CourseDirectory.notebook_id = "*"

# The text nbgrader writes in place of a solution in the student version.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.enforce_metadata = True

# Grading: a test cell that takes longer than this fails (its kernel is interrupted).
c.Execute.timeout = SETTINGS.cell_timeout
c.Execute.interrupt_on_timeout = True

# Outputs in graded notebooks are capped so a print loop cannot bloat the gradebook.
c.LimitOutput.max_lines = SETTINGS.max_output_lines
c.LimitOutput.max_traceback = SETTINGS.max_traceback
