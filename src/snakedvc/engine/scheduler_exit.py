"""A run's Snakemake exits when its scheduler is done, not up to a second later.

Each pass of Snakemake's scheduler (9.x, ``JobScheduler._schedule_reevalutation``) starts a
``threading.Timer`` of ``--max-jobs-per-timespan``'s timespan (default ``100/1s``) that wakes the
scheduler again. The timer's thread is not a daemon, so the interpreter waits for the last one
before it exits: a run whose last job ended within that second stays up to 1 s longer ("Elapsed
time: 0.06 s", then 1.16 s to exit: measured in issue 49). A profile cannot shorten the timespan
(the option's pattern reads ``100ms`` as 100 minutes).

The kit's ``onsuccess`` and ``onerror`` run after the scheduler has returned: a wake-up then has
nothing to wake, so they cancel the scheduler's pending timers (``Timer.cancel``, the standard
library's own way to drop one). Only timers whose function is Snakemake's scheduler's are touched.
A step's Snakemake inside a SLURM job runs no hooks (``--no-hooks``) and still waits.
"""

from __future__ import annotations

import threading

SCHEDULER_MODULE = "snakemake.scheduling.job_scheduler"


def end_pending_scheduler_wakeups() -> int:
    """Cancel the finished scheduler's pending wake-up timers; returns how many."""
    cancelled = 0
    for thread in threading.enumerate():
        function = getattr(thread, "function", None)
        if isinstance(thread, threading.Timer) and getattr(function, "__module__", None) == SCHEDULER_MODULE:
            thread.cancel()
            cancelled += 1
    return cancelled
