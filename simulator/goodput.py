"""The twin's goodput accounting: the live system's, :mod:`shared.goodput` (one accounting
for both, from the same event log). This module keeps the twin's import path."""

from shared.goodput.accounting import *  # noqa: F403 (one list of names: the accounting's)
from shared.goodput.accounting import __all__ as __all__
