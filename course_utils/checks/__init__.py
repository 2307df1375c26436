"""Student self-checks, one per exercise: ``checks.check_<exercise>(your_function)``.

Each check runs your code on several inputs and compares it with the expected outputs; it prints
``✅`` when they agree. Otherwise it raises ``AssertionError`` saying which input failed and how
(shape, NaNs, largest error and where, a causality leak and at which position), with a hint when
your output matches a known mistake. Checks leave your notebook's random state as they found it.
"""

from course_utils.checks.core import Case, CheckFailed, check_causal, compare_function, compare_module, tensor_difference
from course_utils.checks.nb01 import *  # noqa: F401,F403

# TEMPORARY while notebooks 02-06 move to the recorded-expectations engine: a module that does not
# import yet is skipped. Removed before this change is committed.
import importlib as _il  # noqa: E402
for _nb in ("nb02", "nb03", "nb04", "nb05", "nb06"):
    try:
        _m = _il.import_module(f"course_utils.checks.{_nb}")
    except ImportError:
        continue
    globals().update({_n: getattr(_m, _n) for _n in _m.__all__})
