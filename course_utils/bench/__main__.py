"""``python -m course_utils.bench``: see :func:`course_utils.bench.cli.main`."""

import sys

from course_utils.bench.cli import main

sys.exit(main())
