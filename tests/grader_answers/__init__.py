"""The grader end to end on answers: every wrong answer loses points, every right one gets full marks."""
