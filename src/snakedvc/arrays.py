"""A byte-reproducible .npz: numpy's own savez stamps the current time into the zip,
so the same arrays would give different md5s on every run."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np

from snakedvc.io import atomic_path

_EPOCH = (1980, 1, 1, 0, 0, 0)


def save_arrays(path: str | Path, **arrays: np.ndarray) -> None:
    with atomic_path(path) as tmp, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in sorted(arrays):
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.ascontiguousarray(arrays[name]), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, buffer.getvalue())


def load_arrays(path: str | Path) -> dict[str, np.ndarray]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"input file not found: {path}")
    with np.load(path, allow_pickle=False) as data:
        return {name: data[name] for name in data.files}
