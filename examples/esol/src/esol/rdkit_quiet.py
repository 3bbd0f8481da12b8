"""Keep RDKit's per-molecule chatter out of the logs, and capture its error text when we need it."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


class _Collector(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def quiet_rdkit() -> Iterator[list[str]]:
    """Route RDKit's log into a list (yielded) instead of stderr; restore afterwards.

    Silences molflux's per-molecule "DEPRECATION WARNING: please use MorganGenerator".
    """
    from rdkit import RDLogger, rdBase

    rdBase.LogToPythonLogger()
    logger = logging.getLogger("rdkit")
    saved = (logger.handlers[:], logger.propagate, logger.level)
    collector = _Collector()
    logger.handlers = [collector]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    RDLogger.DisableLog("rdApp.warning")  # type: ignore[attr-defined]
    RDLogger.DisableLog("rdApp.info")  # type: ignore[attr-defined]
    try:
        yield collector.messages
    finally:
        logger.handlers, logger.propagate, _ = saved
        logger.setLevel(saved[2])
        RDLogger.EnableLog("rdApp.warning")  # type: ignore[attr-defined]
