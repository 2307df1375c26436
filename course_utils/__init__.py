"""Helpers for the course "Attention, from dot products to GPU".

Modules:
    reference   the answers to every graded exercise (read them after the deadline)
    checks      self-checks that compare your code with the reference and say what is wrong
    data        the book's six-token example sentence
    device      picking cuda, mps or cpu
    plotting    attention heatmaps and bar charts
    rules       what a solution may not do (used by checks and by the grader)
"""

__version__ = "0.1.0"
