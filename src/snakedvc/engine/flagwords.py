"""A config section as an argparse script's flags: one spelling for plain rules and sweep trials."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from typing import Any


def flag_words(values: Mapping[str, Any]) -> str:
    """A config section as command-line words for an argparse script, quoted for a shell (see
    snakedvc.flags, which the workflow and a sweep's trials both use)."""
    words: list[str] = []
    for key in sorted(values):
        value = values[key]
        words.append("--" + str(key).replace("_", "-"))
        items = value if isinstance(value, list) else [value]
        for item in items:
            if isinstance(item, bool):
                words.append("true" if item else "false")
            elif isinstance(item, Mapping | list):
                words.append(json.dumps(item, sort_keys=True))
            else:
                words.append(str(item))
    return shlex.join(words)
