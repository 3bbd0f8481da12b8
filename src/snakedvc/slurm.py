"""What the kit knows of SLURM itself, shared by the host side (report) and the kit's SLURM executor."""

from __future__ import annotations

# States of a job that is still queued or running (SLURM's job state codes).
ACTIVE_STATES = frozenset(
    {
        "PENDING",
        "RUNNING",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "RESIZING",
        "SUSPENDED",
        "CONFIGURING",
        "COMPLETING",
        "STAGE_OUT",
        "SIGNALING",
        "SPECIAL_EXIT",
        "STOPPED",
        "RESV_DEL_HOLD",
        "POWER_UP_NODE",
    }
)
