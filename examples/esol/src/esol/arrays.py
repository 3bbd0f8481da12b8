"""Byte-reproducible .npz files, written and read a block at a time.

numpy's own savez stamps the current time into the zip, so the same arrays would
give different md5s on every run. Here entries carry a fixed date, and every array
is written from a raw temp file in fixed-size blocks: the zip (deflate included)
depends only on the arrays' bytes, never on how they were appended. That is what
makes gathered shards byte-identical to one unsharded run, with memory bounded by
one chunk however large the arrays grow.
"""

from __future__ import annotations

import io
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from snakedvc import atomic_path

_EPOCH = (1980, 1, 1, 0, 0, 0)
BLOCK_BYTES = 1 << 20
# Above this an entry needs zip64 extensions (decided from the size, so the same arrays give the same bytes).
_ZIP64_FROM = 1 << 31


@dataclass
class _Column:
    handle: IO[bytes]
    dtype: np.dtype[Any]
    row_shape: tuple[int, ...]
    rows: int = 0
    scalar: bool = False


class NpzWriter:
    """Append arrays row-chunk by row-chunk; ``close`` writes the .npz atomically.

    Use as a context manager; on an exception nothing is written. ``stored``: entries are not
    compressed, so a reader can take rows straight from the file (snakedvc.torch.ShardedRows).
    """

    def __init__(self, path: str | Path, stored: bool = False) -> None:
        self.path = Path(path)
        self.compression = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = tempfile.TemporaryDirectory(dir=self.path.parent, prefix=f".{self.path.name}.")
        self._columns: dict[str, _Column] = {}

    def declare(self, name: str, dtype: Any, row_shape: tuple[int, ...] = ()) -> None:
        """Make sure ``name`` exists (with zero rows if nothing is appended)."""
        if name not in self._columns:
            handle = open(Path(self._tmp.name) / f"{name}.raw", "w+b")  # noqa: SIM115 - closed in close()
            self._columns[name] = _Column(handle, np.dtype(dtype), tuple(row_shape))

    def append(self, name: str, chunk: np.ndarray) -> None:
        chunk = np.ascontiguousarray(chunk)
        self.declare(name, chunk.dtype, chunk.shape[1:])
        column = self._columns[name]
        if chunk.dtype != column.dtype or chunk.shape[1:] != column.row_shape:
            raise ValueError(
                f"{self.path}: array {name!r} chunk is {chunk.dtype}{list(chunk.shape[1:])}, "
                f"earlier chunks were {column.dtype}{list(column.row_shape)}"
            )
        column.handle.write(chunk.tobytes())
        column.rows += len(chunk)

    def scalar(self, name: str, value: Any) -> None:
        """A 0-d array (a flag or a count), written once."""
        if name in self._columns:
            raise ValueError(f"{self.path}: array {name!r} written twice")
        array = np.asarray(value)
        self.append(name, array.reshape(1))
        self._columns[name].scalar = True

    def close(self) -> None:
        try:
            with atomic_path(self.path) as tmp, zipfile.ZipFile(tmp, "w", self.compression) as archive:
                for name in sorted(self._columns):
                    column = self._columns[name]
                    shape = (column.rows, *column.row_shape)
                    header: dict[str, Any] = {
                        "descr": np.lib.format.dtype_to_descr(column.dtype),
                        "fortran_order": False,
                    }
                    header["shape"] = () if column.scalar else shape
                    _write_entry(archive, name, header, column.handle, self.compression)
        finally:
            self.discard()

    def discard(self) -> None:
        for column in self._columns.values():
            column.handle.close()
        self._tmp.cleanup()

    def __enter__(self) -> NpzWriter:
        return self

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        if kind is None:
            self.close()
        else:
            self.discard()


def _write_entry(
    archive: zipfile.ZipFile, name: str, header: dict[str, Any], data: IO[bytes], compression: int
) -> None:
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, header)
    size = data.seek(0, 2)
    data.seek(0)
    info = zipfile.ZipInfo(f"{name}.npy", date_time=_EPOCH)
    info.compress_type = compression
    info.external_attr = 0o644 << 16
    with archive.open(info, "w", force_zip64=size >= _ZIP64_FROM) as entry:
        entry.write(head.getvalue())
        while block := data.read(BLOCK_BYTES):
            entry.write(block)


def save_arrays(path: str | Path, **arrays: np.ndarray) -> None:
    """Write whole arrays (0-d ones as scalars) as a byte-reproducible .npz."""
    with NpzWriter(path) as writer:
        for name, array in arrays.items():
            array = np.asarray(array)
            if array.ndim == 0:
                writer.scalar(name, array)
            else:
                writer.append(name, array)


def load_arrays(path: str | Path) -> dict[str, np.ndarray]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"input file not found: {path}")
    with np.load(path, allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


def iter_array_chunks(path: str | Path, name: str, max_bytes: int = BLOCK_BYTES) -> Iterator[np.ndarray]:
    """The rows of one array of an .npz, a chunk at a time (never the whole array in memory)."""
    with zipfile.ZipFile(path) as archive, archive.open(f"{name}.npy") as entry:
        version = np.lib.format.read_magic(entry)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(entry)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(entry)
        if fortran:
            raise ValueError(f"{path}: array {name!r} is Fortran-ordered; expected C order")
        if not shape:
            yield np.frombuffer(entry.read(dtype.itemsize), dtype=dtype)
            return
        row_bytes = dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))
        per_chunk = max(1, max_bytes // max(row_bytes, 1))
        left = shape[0]
        while left:
            take = min(per_chunk, left)
            yield np.frombuffer(entry.read(take * row_bytes), dtype=dtype).reshape(take, *shape[1:])
            left -= take
