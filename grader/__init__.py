"""The course's grading tools, built on nbgrader: build, release, check-release, autograde, feedback."""
