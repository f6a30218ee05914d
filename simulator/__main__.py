"""``python -m simulator run|sweep [scenario.yaml] ...``: the ``mtc sim`` commands."""

import sys

from simulator.cli import main

sys.exit(main())
