"""Student self-checks, one per exercise: ``checks.check_<exercise>(your_function)``.

Each check runs your code on several inputs and compares it with the expected outputs; it prints
``✅`` when they agree. Otherwise it raises ``AssertionError`` saying which input failed and how
(shape, NaNs, largest error and where, a causality leak and at which position), with a hint when
your output matches a known mistake. Checks leave your notebook's random state as they found it.
"""

from course_utils.checks.core import Case, CheckFailed, check_causal, tensor_difference
from course_utils.checks.nb01 import *  # noqa: F401,F403
from course_utils.checks.nb02 import *  # noqa: F401,F403
from course_utils.checks.nb03 import *  # noqa: F401,F403
from course_utils.checks.nb04 import *  # noqa: F401,F403
from course_utils.checks.nb05 import *  # noqa: F401,F403
from course_utils.checks.nb06 import *  # noqa: F401,F403
from course_utils.checks.nb07 import *  # noqa: F401,F403
from course_utils.checks.nb08 import *  # noqa: F401,F403
from course_utils.checks.nb09 import *  # noqa: F401,F403
from course_utils.checks.nb10 import *  # noqa: F401,F403
from course_utils.checks.nb11 import *  # noqa: F401,F403

#: exercise -> its spec (``course_utils.checks.spec.Spec``), for every check declared by one: the grader
#: builds each plan from it, and the tests hold every judge against its plan.
SPECS = {name.removeprefix("check_"): value.spec for name, value in list(globals().items())
         if name.startswith("check_") and hasattr(value, "spec")}
