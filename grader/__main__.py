"""``python -m grader``: see :mod:`grader.cli`."""

import sys

from grader.cli import main

sys.exit(main())
