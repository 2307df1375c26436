"""nbgrader configuration shared by ``python -m grader`` and by instructors who run nbgrader directly.

``python -m grader`` loads this file, then sets ``CourseDirectory.root`` to its own working
folder. To use the nbgrader command line or the formgrader by hand, copy this file into the
course folder that nbgrader works in.
"""

c = get_config()  # noqa: F821 - provided by traitlets when the file is loaded

c.CourseDirectory.course_id = "attention-course"
# Each notebook of the course is one assignment holding one notebook.
c.CourseDirectory.notebook_id = "*"

# The text nbgrader writes in place of a solution in the student version.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.enforce_metadata = True

# Grading: a test cell that takes longer than this fails (its kernel is interrupted).
c.ExecutePreprocessor.timeout = 120
c.Execute.timeout = 120
c.Execute.interrupt_on_timeout = True

# Outputs in graded notebooks are capped so a print loop cannot bloat the gradebook.
c.LimitOutput.max_lines = 200
c.LimitOutput.max_traceback = 40
