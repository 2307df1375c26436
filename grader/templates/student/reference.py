"""Not part of the student edition.

``course_utils.reference`` holds the course's answers. It exists only in the instructor edition;
the self-checks of this edition compare your code with recorded expected outputs instead.
"""

raise ImportError(
    "course_utils.reference holds the course's answers and is not part of the student edition. "
    "Write the exercise yourself; the check cell under it compares your code with recorded outputs."
)
