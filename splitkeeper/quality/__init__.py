"""Data-quality checks of a pipeline's state and sink (Great Expectations).

:func:`run_restart_checks` runs the protocol section 6 suites of ``expectations/`` on a
checkpoint and its sink; :func:`raise_on_failure` turns a failed report into
:class:`~splitkeeper.errors.InvariantViolation`. Importing this package imports
neither Spark nor Great Expectations; running the checks does.
"""

from splitkeeper.quality.checks import (
    CheckReport,
    ExpectationOutcome,
    SuiteOutcome,
    SuiteStatus,
    raise_on_failure,
    run_restart_checks,
)

__all__ = [
    "CheckReport",
    "ExpectationOutcome",
    "SuiteOutcome",
    "SuiteStatus",
    "raise_on_failure",
    "run_restart_checks",
]
