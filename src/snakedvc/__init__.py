"""snakedvc: a kit that any Snakemake project adopts in a few lines.

Public API (everything else is internal):
- ``ConfigError``, ``validate_config``: config checked against a JSON schema at start.
"""

from snakedvc.config import ConfigError, validate_config

__version__ = "0.1.0"
__all__ = ["ConfigError", "validate_config", "__version__"]
