"""ESOL's own training error, importable without torch (the CLI catches it for every step)."""


class TrainingDivergedError(RuntimeError):
    """The loss became NaN or infinite."""
