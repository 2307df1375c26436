"""Student self-checks, one per exercise: ``checks.check_<exercise>(your_function)``.

Each check runs your code and the reference on several inputs and prints ``✅`` when they agree.
Otherwise it raises ``AssertionError`` saying which input failed and how (shape, NaNs, largest
error and where, a causality leak and at which position). Checks leave your notebook's random
state as they found it.
"""

from course_utils.checks.core import Case, CheckFailed, check_causal, compare_function, compare_module, tensor_difference
from course_utils.checks.core import preserve_rng as _preserve_rng
from course_utils.checks.nb01 import *  # noqa: F401,F403
from course_utils.checks.nb02 import *  # noqa: F401,F403
from course_utils.checks.nb03 import *  # noqa: F401,F403
from course_utils.checks.nb04 import *  # noqa: F401,F403
from course_utils.checks.nb05 import *  # noqa: F401,F403
from course_utils.checks.nb06 import *  # noqa: F401,F403

for _name in [n for n in list(globals()) if n.startswith("check_")]:
    globals()[_name] = _preserve_rng(globals()[_name])
del _name
