"""One goodput accounting for the live system and the twin: pure functions over the event log.

- :mod:`shared.goodput.totals`: the badput categories, the per-job and fleet totals and the
  goodput factors (scheduling x runtime x program) as their properties;
- :mod:`shared.goodput.accounting`: how an event log becomes those totals, each lost second
  in one category and tied to the cause of the disruption that started it (``account``);
- :mod:`shared.goodput.live`: the same for one job of the live system, whose nominal costs
  are measured from the log (``job_accounting``).

The twin calls ``account`` with its scenario's figures; ``make demo``, the console, the job
metrics and ``mtc replay`` call ``job_accounting``. docs/validation.md compares both with
Google's public calculator (ml-goodput-measurement).
"""

from shared.goodput.accounting import *  # noqa: F403 (the accounting's names, once)
from shared.goodput.accounting import __all__ as _ACCOUNTING
from shared.goodput.live import JobAccounting, infer_params, job_accounting

__all__ = [*_ACCOUNTING, "JobAccounting", "infer_params", "job_accounting"]
