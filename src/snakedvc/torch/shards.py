"""Training on rows spread over array shard files, larger than a node's memory: `ShardedRows`.

A step's shards (``.npz`` files holding the same named arrays, or ``.npy`` files, one list per
array) are read a batch at a time, never loaded whole: each rank reads only its share of each
global batch, with one ``pread`` per run of consecutive rows. The kernel's page cache does the
caching; a process's resident memory stays flat however large the data. (A memory map was
measured first: every page a batch touched stayed mapped, several at a time with the kernel's
large folios, so a rank's resident memory grew to the size of the data until pages were given
back, and reading was no faster.) Bit-packed rows (``numpy.packbits``) are unpacked per batch.

The order is global and seeded: per epoch, rows are cut into blocks of ``block_rows``
consecutive rows, the blocks are shuffled and each block's rows are shuffled (one seeded
permutation per epoch, rotated by a seeded amount per block), all a pure function of (seed,
epoch, number of rows). Global batch s is positions [s*B, (s+1)*B) of that
order, whatever the number of ranks; rank r of N takes a contiguous share of it (the shares
differ by at most one row), so N ranks train on exactly the rows 1 rank does, with no row padded
or repeated. The last batch of an epoch holds what is left (fewer than B rows; where it holds
fewer rows than there are ranks, some ranks get none and must still take part in the step).

``batches(epoch, ...)`` is what a loop iterates; given to ``Resumable.steps`` it starts a
resumed epoch at its step without reading the steps before, so a run stopped mid-epoch resumes
at the next batch.
"""

from __future__ import annotations

import math
import os
import queue
import threading
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

T = TypeVar("T")


class ShardError(ValueError):
    """A shard is missing, truncated or unlike the others: names the file; raised before training."""


@dataclass(frozen=True)
class _Array:
    """One array of one shard: where its rows start in the file."""

    path: str
    offset: int
    rows: int
    row_shape: tuple[int, ...]
    dtype: np.dtype[Any]

    @property
    def row_bytes(self) -> int:
        return int(self.dtype.itemsize * math.prod(self.row_shape))


def _npy_header(handle: Any, path: str, what: str) -> tuple[tuple[int, ...], np.dtype[Any], int]:
    try:
        version = np.lib.format.read_magic(handle)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(handle)
    except ValueError as error:
        raise ShardError(f"shard {path}: {what} is not a .npy array ({error})") from None
    if fortran:
        raise ShardError(f"shard {path}: {what} is Fortran-ordered; write it in C order")
    if dtype.hasobject:
        raise ShardError(f"shard {path}: {what} holds Python objects; write plain numbers")
    return tuple(shape), dtype, handle.tell()


def _check_size(array: _Array, what: str) -> _Array:
    size = os.path.getsize(array.path)
    end = array.offset + array.rows * array.row_bytes
    if size < end:
        raise ShardError(
            f"shard {array.path}: truncated: {what} needs {end} bytes ({array.rows} rows from byte {array.offset}), "
            f"the file has {size}; write it again"
        )
    return array


def open_npy(path: str | Path) -> _Array:
    """Where the rows of a .npy file start; ShardError naming the file where it is none."""
    path = str(path)
    if not os.path.isfile(path):
        raise ShardError(f"shard {path}: no such file")
    with open(path, "rb") as handle:
        shape, dtype, offset = _npy_header(handle, path, "the file")
    if not shape:
        raise ShardError(f"shard {path}: a 0-d array has no rows")
    return _check_size(_Array(path, offset, shape[0], shape[1:], dtype), "its array")


def open_npz_member(path: str | Path, name: str) -> _Array:
    """Where the rows of array ``name`` of a .npz start; the array must be stored uncompressed
    (``numpy.savez``, not ``savez_compressed``): its bytes are read in place."""
    path = str(path)
    if not os.path.isfile(path):
        raise ShardError(f"shard {path}: no such file")
    try:
        with zipfile.ZipFile(path) as archive:
            info = archive.getinfo(f"{name}.npy")
    except KeyError:
        raise ShardError(f"shard {path}: no array {name!r}") from None
    except (zipfile.BadZipFile, OSError) as error:
        raise ShardError(f"shard {path}: not a readable .npz (truncated?): {error}") from None
    if info.compress_type != zipfile.ZIP_STORED:
        raise ShardError(
            f"shard {path}: array {name!r} is compressed; streaming reads arrays in place, so write shards "
            "uncompressed (numpy.savez, not savez_compressed)"
        )
    with open(path, "rb") as handle:
        handle.seek(info.header_offset)
        local = handle.read(30)
        if len(local) < 30 or local[:4] != b"PK\x03\x04":
            raise ShardError(f"shard {path}: array {name!r}: bad zip entry (truncated?)")
        name_length, extra_length = int.from_bytes(local[26:28], "little"), int.from_bytes(local[28:30], "little")
        handle.seek(info.header_offset + 30 + name_length + extra_length)
        shape, dtype, offset = _npy_header(handle, path, f"array {name!r}")
    if not shape:
        raise ShardError(f"shard {path}: array {name!r} is 0-d: it has no rows")
    return _check_size(_Array(path, offset, shape[0], shape[1:], dtype), f"array {name!r}")


class _Files:
    """Open file descriptors, one per path and process (a DataLoader worker opens its own)."""

    def __init__(self) -> None:
        self._pid = -1
        self._fds: dict[str, int] = {}

    def fd(self, path: str) -> int:
        if self._pid != os.getpid():
            self._pid, self._fds = os.getpid(), {}
        if path not in self._fds:
            self._fds[path] = os.open(path, os.O_RDONLY)
        return self._fds[path]

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]


def share(n: int, rank: int, world: int) -> slice:
    """Rank ``rank``'s contiguous share of ``n`` items (shares differ by at most one)."""
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (1 if rank < extra else 0))


class ShardedRows:
    """The rows of a set of shards, in a seeded global order per epoch, read a batch at a time.

    ``shards``: ``.npz`` paths (each holding every array of ``columns``), or a mapping from an
    array's name to its ``.npy`` paths (the k-th file of each array is shard k). ``unpack``: arrays
    of ``numpy.packbits`` rows and their width in bits, unpacked per batch to float32 0/1.
    ``order(epoch, n)``: the epoch's order as a permutation of range(n), where a loop has its own
    (a loop that also trains in memory, to see the same batches both ways); by default the seeded
    blocks above. Every shard is opened and checked here: a missing, truncated or dissimilar one
    raises ShardError naming its file before any training starts.
    """

    def __init__(
        self,
        shards: Sequence[str | Path] | Mapping[str, Sequence[str | Path]],
        columns: Sequence[str] | None = None,
        unpack: Mapping[str, int] | None = None,
        seed: int = 0,
        block_rows: int = 64,
        order: Callable[[int, int], np.ndarray | torch.Tensor] | None = None,
    ) -> None:
        if block_rows < 1:
            raise ValueError(f"block_rows must be >= 1, got {block_rows}")
        self.seed, self.block_rows, self.order = seed, block_rows, order
        self.unpack = dict(unpack or {})
        self._arrays = self._open(shards, columns)  # shard -> column -> array
        self.columns = tuple(self._arrays[0]) if self._arrays else tuple(columns or ())
        counts = [next(iter(arrays.values())).rows for arrays in self._arrays]
        self._starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        self._files = _Files()
        self._plan: tuple[Any, ...] | None = None
        self._order: tuple[int, np.ndarray] | None = None

    @staticmethod
    def _open(shards: Any, columns: Sequence[str] | None) -> list[dict[str, _Array]]:
        if isinstance(shards, Mapping):
            names = list(columns or shards)
            lengths = {len(shards[name]) for name in names}
            if len(lengths) != 1:
                raise ShardError(f"every array needs one .npy file per shard; got {[len(shards[n]) for n in names]}")
            found = [{name: open_npy(shards[name][k]) for name in names} for k in range(lengths.pop())]
        else:
            if not columns:
                raise ValueError("name the arrays to read from the .npz shards (columns=...)")
            found = [{name: open_npz_member(path, name) for name in columns} for path in shards]
        if not found:
            raise ShardError("no shards given")
        # A shard without rows (every molecule of its block rejected, say) adds nothing, and its
        # arrays' row shapes may not be known: it is left out.
        found = [arrays for arrays in found if next(iter(arrays.values())).rows] or found[:1]
        first = found[0]
        for arrays in found:
            counts = {name: array.rows for name, array in arrays.items()}
            if len(set(counts.values())) != 1:
                where = next(iter(arrays.values())).path
                raise ShardError(f"shard {where}: its arrays have different numbers of rows: {counts}")
            for name, array in arrays.items():
                expected = first[name]
                if (array.dtype, array.row_shape) != (expected.dtype, expected.row_shape):
                    raise ShardError(
                        f"shard {array.path}: array {name!r} is {array.dtype}{list(array.row_shape)}, but "
                        f"{expected.dtype}{list(expected.row_shape)} in shard {expected.path}"
                    )
        return found

    def __len__(self) -> int:
        return int(self._starts[-1])

    @property
    def shards(self) -> int:
        """How many shards hold rows (those without any are left out)."""
        return len(self._arrays)

    # -- the order

    def _epoch_plan(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The epoch's block order, where each block starts in it (positions), the shared order
        within a full block and each block's rotation of it."""
        if self._plan is None or self._plan[0] != epoch:
            n, size = len(self), self.block_rows
            n_blocks = -(-n // size)
            rng = np.random.default_rng([self.seed, epoch])
            order = rng.permutation(n_blocks)
            # One permutation of a block's rows per epoch, rotated by a seeded amount per block:
            # a drawn permutation per block cost more than reading it (0.86x in memory's speed).
            within = rng.permutation(size)
            shifts = rng.integers(0, size, n_blocks)
            sizes = np.full(n_blocks, size, dtype=np.int64)
            if n_blocks:
                sizes[-1] = n - size * (n_blocks - 1)
            starts = np.concatenate([[0], np.cumsum(sizes[order])])
            self._plan = (epoch, order, starts, within, shifts)
        return self._plan[1:]

    def _given_order(self, epoch: int) -> np.ndarray:
        if self._order is None or self._order[0] != epoch:
            assert self.order is not None
            order = np.asarray(self.order(epoch, len(self)), dtype=np.int64)
            if order.shape != (len(self),):
                raise ValueError(f"order({epoch}, {len(self)}) gave {order.shape[0]} rows, not {len(self)}")
            self._order = (epoch, order)
        return self._order[1]

    def rows_at(self, epoch: int, start: int, stop: int) -> np.ndarray:
        """Global row numbers at positions [start, stop) of the epoch's order."""
        if self.order is not None:
            return self._given_order(epoch)[start : min(stop, len(self))].copy()
        order, starts, within, shifts = self._epoch_plan(epoch)
        size = self.block_rows
        positions = np.arange(start, min(stop, len(self)), dtype=np.int64)
        slots = np.searchsorted(starts, positions, side="right") - 1
        blocks = order[slots]
        offsets = positions - starts[slots]
        rows = blocks * size + (within[offsets] + shifts[blocks]) % size
        short = blocks == len(order) - 1  # the last block, where rows do not fill it
        last = len(self) - (len(order) - 1) * size
        if last < size and short.any():
            # Its own seeded permutation (a rotation of `within` would reach past its end).
            mine = np.random.default_rng([self.seed, epoch, 1]).permutation(last)
            rows[short] = (len(order) - 1) * size + mine[offsets[short]]
        return rows

    def steps(self, batch_size: int) -> int:
        """Global batches per epoch (the last may be short)."""
        return -(-len(self) // batch_size)

    def global_batch(self, epoch: int, step: int, batch_size: int) -> np.ndarray:
        """The row numbers of global batch ``step``: the same for any number of ranks."""
        return self.rows_at(epoch, step * batch_size, (step + 1) * batch_size)

    def rank_rows(self, epoch: int, step: int, batch_size: int, rank: int = 0, world: int = 1) -> np.ndarray:
        """Rank ``rank``'s contiguous share of global batch ``step``."""
        first = step * batch_size
        size = min(batch_size, len(self) - first)
        mine = share(max(size, 0), rank, world)
        return self.rows_at(epoch, first + mine.start, first + mine.stop)

    # -- reading

    def read(
        self, rows: np.ndarray, columns: Sequence[str] | None = None, device: torch.device | str | None = None
    ) -> dict[str, torch.Tensor]:
        """These rows (global numbers), in this order, as tensors (of ``columns``, default all);
        packed arrays unpacked. ``device``: where the tensors go; packed arrays travel packed and
        are unpacked there (a GPU then receives 1/32 of the bytes and does the unpacking)."""
        rows = np.asarray(rows, dtype=np.int64)
        ordered = np.argsort(rows, kind="stable")
        sorted_rows = rows[ordered]
        out = {}
        for name in columns or self.columns:
            values = self._read_sorted(name, sorted_rows)
            result = np.empty_like(values)
            result[ordered] = values
            if device is not None:
                tensor = torch.from_numpy(result).to(device)
                out[name] = _unpack_bits(tensor, self.unpack[name]) if name in self.unpack else tensor
            elif name in self.unpack:
                out[name] = torch.from_numpy(np.unpackbits(result, axis=1, count=self.unpack[name]).astype(np.float32))
            else:
                out[name] = torch.from_numpy(result)
        return out

    def _read_sorted(self, name: str, rows: np.ndarray) -> np.ndarray:
        template = self._arrays[0][name]
        out = np.empty((len(rows), *template.row_shape), dtype=template.dtype)
        if not len(rows):
            return out
        if rows[0] < 0 or rows[-1] >= len(self):
            raise IndexError(f"rows {rows[0]}..{rows[-1]} outside 0..{len(self) - 1}")
        flat = out.reshape(len(rows), -1).view(np.uint8)
        shard_of = np.searchsorted(self._starts, rows, side="right") - 1
        bounds = np.flatnonzero(np.diff(shard_of)) + 1
        for begin, end in zip(np.concatenate([[0], bounds]), np.concatenate([bounds, [len(rows)]]), strict=True):
            shard = int(shard_of[begin])
            array = self._arrays[shard][name]
            local = rows[begin:end] - self._starts[shard]
            # One read per run of consecutive rows (a shuffled batch: mostly one row each).
            first = np.concatenate([[0], np.flatnonzero(np.diff(local) != 1) + 1])
            lengths = np.diff(np.concatenate([first, [len(local)]])) * array.row_bytes
            offsets = array.offset + local[first] * array.row_bytes
            fd, pread = self._files.fd(array.path), os.pread
            data = b"".join([pread(fd, n, at) for n, at in zip(lengths.tolist(), offsets.tolist(), strict=True)])
            if len(data) != (end - begin) * array.row_bytes:
                raise ShardError(f"shard {array.path}: array {name!r} ended early (the file shrank?)")
            flat[begin:end] = np.frombuffer(data, dtype=np.uint8).reshape(end - begin, -1)
        return out

    def batches(
        self,
        epoch: int,
        batch_size: int,
        rank: int = 0,
        world: int = 1,
        workers: int = 0,
        read_ahead: int = 1,
        device: torch.device | str | None = None,
    ) -> Batches:
        """This rank's share of every global batch of the epoch, in order. ``read_ahead``: batches a
        thread reads ahead of the loop (0: each read when asked for); ``workers``: DataLoader
        processes reading ahead instead; ``device``: where batches go (see ``read``; with
        workers, which cannot use a GPU, they are unpacked in the workers and moved after)."""
        return Batches(self, epoch, batch_size, rank, world, workers, read_ahead, device)

    def chunks(
        self, chunk_rows: int = 65536, rank: int = 0, world: int = 1, columns: Sequence[str] | None = None
    ) -> Iterator[dict[str, torch.Tensor]]:
        """Rank ``rank``'s contiguous share of all rows, in file order, ``chunk_rows`` at a time
        (for evaluation and statistics; ``columns``: only these arrays)."""
        mine = share(len(self), rank, world)
        for start in range(mine.start, mine.stop, chunk_rows):
            yield self.read(np.arange(start, min(start + chunk_rows, mine.stop), dtype=np.int64), columns)


def _unpack_bits(packed: torch.Tensor, width: int) -> torch.Tensor:
    """numpy.unpackbits of uint8 rows (most significant bit first), the first ``width`` bits, as
    float32 0/1, on the tensor's own device."""
    shifts = torch.arange(7, -1, -1, dtype=torch.uint8, device=packed.device)
    bits = (packed.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(len(packed), -1)[:, :width].float()


def _read_ahead(read: Callable[[int], T], steps: range, depth: int) -> Iterator[T]:
    """``read(step)`` for every step, in order, done by a thread ``depth`` steps ahead of the
    consumer: the reads (system calls, unpacking: no GIL held) overlap the training step. Closing
    the iterator (a stop, an error in the loop) ends the thread."""
    ready: queue.Queue[Any] = queue.Queue(maxsize=depth)
    closed = threading.Event()

    def put(item: Any) -> bool:
        while not closed.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for step in steps:
                if not put(("batch", read(step))):
                    return
            put(("end", None))
        except BaseException as error:  # handed to the consumer, raised there
            put(("error", error))

    thread = threading.Thread(target=work, name="ShardedRows read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            kind, item = ready.get()
            if kind == "end":
                return
            if kind == "error":
                raise item
            yield item
    finally:
        closed.set()
        thread.join()


class _EpochSteps(torch.utils.data.Dataset):
    def __init__(self, batches: Batches, first: int) -> None:
        self.batches, self.first = batches, first

    def __len__(self) -> int:
        return len(self.batches) - self.first

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.batches.batch(self.first + index)


@dataclass
class Batches:
    """One rank's batches of one epoch; ``starting_at(step)`` skips the steps before without reading them."""

    rows: ShardedRows
    epoch: int
    batch_size: int
    rank: int = 0
    world: int = 1
    workers: int = 0
    read_ahead: int = 1
    device: torch.device | str | None = None

    def __len__(self) -> int:
        return self.rows.steps(self.batch_size)

    def batch(self, step: int, device: torch.device | str | None = None) -> dict[str, torch.Tensor]:
        rows = self.rows.rank_rows(self.epoch, step, self.batch_size, self.rank, self.world)
        return self.rows.read(rows, device=device)

    def starting_at(self, step: int) -> Iterator[dict[str, torch.Tensor]]:
        if self.workers > 0:
            loader = torch.utils.data.DataLoader(
                _EpochSteps(self, step), batch_size=None, shuffle=False, num_workers=self.workers
            )
            if self.device is None:
                return iter(loader)
            return ({name: t.to(self.device) for name, t in batch.items()} for batch in loader)
        read = partial(self.batch, device=self.device)
        if self.read_ahead > 0:
            return _read_ahead(read, range(step, len(self)), self.read_ahead)
        return (read(s) for s in range(step, len(self)))

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return self.starting_at(0)
