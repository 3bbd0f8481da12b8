"""Ids that sort by time and do not collide: a detached run's, an exp run plan's folder."""

from __future__ import annotations

import datetime as dt
import secrets
import time


def new_run_id(now: float | None = None) -> str:
    """``20261126-231716-833e``: the local time, then 4 random hex digits."""
    stamp = dt.datetime.fromtimestamp(now or time.time()).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{secrets.token_hex(2)}"
