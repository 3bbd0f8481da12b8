"""snakedvc.torch.ShardedRows: rows streamed from array shards, the same global batches on 1, 2 or 3
ranks, no row padded or repeated, a stop mid-epoch resumed bit for bit (1 and 2 ranks), bad shards
named before training.

This file also runs as a user's training script (``python tests/test_shards.py ...``) for the
torchrun test: a plain loop on ShardedRows and Resumable.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from snakedvc.torch import EXIT_CHECKPOINTED, Resumable, ShardedRows, ShardError, TrainingStopped
from snakedvc.torch.distributed import session

BITS = 20
SIZES = [100, 100, 37]  # an uneven last shard
BATCH = 16


def write_shards(folder: Path, sizes: list[int] = SIZES, save=np.savez) -> list[Path]:
    """Shards whose row r holds its own number: y = r, X = r's low BITS bits, packed."""
    folder.mkdir(parents=True, exist_ok=True)
    paths, first = [], 0
    for k, size in enumerate(sizes):
        rows = np.arange(first, first + size, dtype=np.int64)
        bits = (rows[:, None] >> np.arange(BITS)) & 1
        path = folder / f"{k}.npz"
        save(path, X=np.packbits(bits.astype(np.uint8), axis=1), y=rows.astype(np.float64), n=np.array(size))
        paths.append(path)
        first += size
    return paths


# ---------------------------------------------------------------- the user's loop


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="a toy regression on sharded rows, trained resumably")
    parser.add_argument("--shards", nargs="+", required=True)
    parser.add_argument("--out", required=True, help="where rank 0 writes the final weights")
    parser.add_argument("--checkpoint-dir", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--kill-at", type=int, default=0, help="SIGTERM to this process after this many steps")
    parser.add_argument("--workers", type=int, default=0)
    return parser.parse_args(argv)


def train(argv: list[str]) -> None:
    args = parse(argv)
    with session() as ctx:
        torch.manual_seed(0)
        rows = ShardedRows(args.shards, columns=["X", "y"], unpack={"X": BITS}, seed=1, block_rows=8)
        model = nn.Sequential(nn.Linear(BITS, 8), nn.Tanh(), nn.Linear(8, 1)).double()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        resume = Resumable({"epochs": args.epochs}, root=args.checkpoint_dir, inputs=args.shards, ctx=ctx)
        net = nn.parallel.DistributedDataParallel(model) if ctx.distributed else model
        done = 0
        for epoch in resume.epochs(args.epochs, model, optimizer):
            batches = rows.batches(epoch, BATCH, ctx.rank, ctx.world_size, workers=args.workers)
            for step, batch in resume.steps(batches, epoch):
                size = len(rows.global_batch(epoch, step, BATCH))
                # The loss of the whole global batch, its mean: DDP averages over ranks, so scale by world / size.
                loss = ((net(batch["X"].double()).squeeze(-1) - batch["y"] / 237) ** 2).sum() * ctx.world_size / size
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                done += 1
                if done == args.kill_at:
                    os.kill(os.getpid(), signal.SIGTERM)  # every rank: the next step is where they stop
            resume.log(loss=float(loss))
        resume.finish()
        if ctx.is_main:
            torch.save(model.state_dict(), args.out)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        train(sys.argv[1:])
    except TrainingStopped as stopped:
        print(f"rank {os.environ.get('RANK', '0')}: {stopped}", flush=True)
        return EXIT_CHECKPOINTED
    return 0


# ---------------------------------------------------------------- tests

pytestmark = pytest.mark.usefixtures("own_signal_handlers")


@pytest.fixture
def shards(tmp_path: Path) -> list[Path]:
    return write_shards(tmp_path / "shards")


def test_global_batches_are_the_same_rows_for_1_2_and_3_ranks_with_none_padded_or_repeated(shards) -> None:
    rows = ShardedRows(shards, columns=["X", "y"], unpack={"X": BITS}, seed=5, block_rows=8)
    n = sum(SIZES)
    assert len(rows) == n and rows.steps(BATCH) == -(-n // BATCH)
    for epoch in (1, 2):
        seen = []
        for step in range(rows.steps(BATCH)):
            batch = rows.global_batch(epoch, step, BATCH)
            # The last batch holds what is left: 237 = 14 x 16 + 13.
            assert len(batch) == (n % BATCH if step == rows.steps(BATCH) - 1 else BATCH)
            for world in (1, 2, 3):
                shares = [rows.rank_rows(epoch, step, BATCH, rank, world) for rank in range(world)]
                assert np.array_equal(np.concatenate(shares), batch), (epoch, step, world)
                assert max(map(len, shares)) - min(map(len, shares)) <= 1
                # What each rank reads is those rows: y is the row's number, X its bits.
                for share in shares:
                    read = rows.read(share)
                    assert read["y"].tolist() == share.astype(float).tolist()
                    bits = (torch.from_numpy(share)[:, None] >> torch.arange(BITS)) & 1
                    assert torch.equal(read["X"], bits.float())
            seen.append(batch)
        order = np.concatenate(seen)
        assert sorted(order.tolist()) == list(range(n))  # every row once an epoch
    assert not np.array_equal(rows.rows_at(1, 0, n), rows.rows_at(2, 0, n))  # a new order each epoch
    assert not np.array_equal(rows.rows_at(1, 0, n), np.arange(n))


def test_the_order_is_a_function_of_seed_and_epoch_not_of_how_rows_are_sharded(tmp_path: Path, shards) -> None:
    other = write_shards(tmp_path / "other", sizes=[37, 63, 137])  # the same 237 rows, cut elsewhere
    a = ShardedRows(shards, columns=["y"], seed=5)
    b = ShardedRows(other, columns=["y"], seed=5)
    assert np.array_equal(a.rows_at(3, 0, 237), b.rows_at(3, 0, 237))
    assert torch.equal(a.read(a.global_batch(3, 4, BATCH))["y"], b.read(b.global_batch(3, 4, BATCH))["y"])
    assert not np.array_equal(a.rows_at(3, 0, 237), ShardedRows(shards, columns=["y"], seed=6).rows_at(3, 0, 237))
    # .npy shards, one list per array, read the same.
    npy = {"y": []}
    for k, path in enumerate(shards):
        npy["y"].append(tmp_path / f"y{k}.npy")
        np.save(npy["y"][-1], np.load(path)["y"])
    c = ShardedRows(npy, seed=5)
    assert torch.equal(c.read(c.global_batch(3, 4, BATCH))["y"], a.read(a.global_batch(3, 4, BATCH))["y"])


def test_batches_sent_to_a_device_are_unpacked_there_to_the_same_values(tmp_path: Path) -> None:
    # Widths that end inside a byte and on one; a GPU takes the same path as device="cpu" here.
    for bits in (13, 16):
        path = tmp_path / f"w{bits}.npz"
        X = np.random.default_rng(bits).integers(0, 2, size=(50, bits)).astype(np.uint8)
        np.savez(path, X=np.packbits(X, axis=1), y=np.arange(50.0))
        rows = ShardedRows([path], columns=["X", "y"], unpack={"X": bits}, seed=1, block_rows=4)
        on_host = list(rows.batches(2, 8, read_ahead=0))
        on_device = list(rows.batches(2, 8, device="cpu"))
        assert len(on_host) == len(on_device) == 7
        for host, device in zip(on_host, on_device, strict=True):
            assert host["X"].dtype == device["X"].dtype == torch.float32
            assert torch.equal(host["X"], device["X"]) and torch.equal(host["y"], device["y"])
            assert torch.equal(device["X"], torch.from_numpy(X[device["y"].long().numpy()]).float())


def test_a_last_batch_smaller_than_the_ranks_leaves_some_ranks_none(tmp_path: Path) -> None:
    rows = ShardedRows(write_shards(tmp_path / "s", sizes=[17]), columns=["y"], seed=0)
    shares = [rows.rank_rows(1, 1, BATCH, rank, 3) for rank in range(3)]  # step 1 holds 1 row
    assert [len(s) for s in shares] == [1, 0, 0]
    assert rows.read(shares[1])["y"].shape == (0,)


def test_bad_shards_are_named_before_anything_is_read(tmp_path: Path, shards) -> None:
    with pytest.raises(ShardError, match=f"shard {tmp_path}/shards/9.npz: no such file"):
        ShardedRows([*shards, tmp_path / "shards" / "9.npz"], columns=["X", "y"])
    # A .npy cut short (a job killed while writing it, a copy that did not finish).
    npy = tmp_path / "y.npy"
    np.save(npy, np.arange(100.0))
    npy.write_bytes(npy.read_bytes()[:-80])
    with pytest.raises(ShardError, match=rf"shard {npy}: truncated: its array needs 928 bytes .*the file has 848"):
        ShardedRows({"y": [npy]})
    # A .npz cut short: its zip directory is gone.
    cut = tmp_path / "cut.npz"
    cut.write_bytes(shards[1].read_bytes()[:-100])
    with pytest.raises(ShardError, match=f"shard {cut}: not a readable .npz"):
        ShardedRows([shards[0], cut], columns=["X", "y"])
    compressed = write_shards(tmp_path / "z", sizes=[10], save=np.savez_compressed)[0]
    with pytest.raises(
        ShardError, match=f"shard {compressed}: array 'X' is compressed.*numpy.savez, not savez_compressed"
    ):
        ShardedRows([compressed], columns=["X", "y"])
    with pytest.raises(ShardError, match=f"shard {shards[0]}: no array 'Z'"):
        ShardedRows(shards, columns=["Z"])
    odd = tmp_path / "odd.npz"
    np.savez(odd, X=np.zeros((5, 3), dtype=np.uint8), y=np.zeros(5, dtype=np.float32))
    dissimilar = rf"shard {odd}: array 'y' is float32\[\], but float64\[\] in shard {shards[0]}"
    with pytest.raises(ShardError, match=dissimilar):
        ShardedRows([shards[0], odd], columns=["X", "y"])


class CountingRows(ShardedRows):
    """Counts the rows it reads: a resumed epoch must not read the steps it skips."""

    read_rows = 0

    def read(self, rows: np.ndarray, *args, **kwargs) -> dict[str, torch.Tensor]:
        CountingRows.read_rows += len(rows)
        return super().read(rows, *args, **kwargs)


def test_resumable_starts_a_resumed_epoch_at_its_step_without_reading_the_steps_before(tmp_path: Path, shards) -> None:
    from tests.conftest import StopAfter

    rows = CountingRows(shards, columns=["y"], seed=0)
    model = nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    resume = Resumable({"run": 1}, root=tmp_path / "ckpt", inputs=[str(p) for p in shards], stop=StopAfter(9))
    resume.load(model, optimizer)
    taken = []
    with pytest.raises(TrainingStopped, match="at epoch 1 step 9"):
        for step, _ in resume.steps(rows.batches(1, BATCH), 1):
            taken.append(step)
    assert taken == list(range(9))
    CountingRows.read_rows = 0
    again = Resumable({"run": 1}, root=tmp_path / "ckpt", inputs=[str(p) for p in shards], stop=StopAfter(99))
    again.load(model, optimizer)
    resumed = list(again.steps(rows.batches(1, BATCH), 1))
    assert resumed[0][0] == 9 and len(resumed) == rows.steps(BATCH) - 9
    assert CountingRows.read_rows == 237 - 9 * BATCH  # the 9 steps before were not read again
    assert torch.equal(resumed[0][1]["y"], rows.read(rows.global_batch(1, 9, BATCH))["y"])


def run_script(shards: list[Path], out: Path, procs: int, *extra: str) -> subprocess.CompletedProcess[str]:
    from tests.conftest import venv_env

    out.mkdir(parents=True, exist_ok=True)
    script = ["python", __file__, "--shards", *map(str, shards), "--out", str(out / "model.pt"),
              "--checkpoint-dir", str(out / "ckpt"), *extra]  # fmt: skip
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={procs}",
        "--no-python",
    ]
    command = [*launcher, *script] if procs > 1 else [sys.executable, *script[1:]]
    return subprocess.run(command, env=venv_env(), capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("procs", [1, 2])
def test_a_stop_mid_epoch_resumes_at_the_next_batch_bit_for_bit(shards, tmp_path: Path, procs: int) -> None:
    reference = run_script(shards, tmp_path / "ref", procs, "--workers", "1")
    assert reference.returncode == 0, reference.stdout + reference.stderr
    stopped = run_script(shards, tmp_path / "int", procs, "--kill-at", "20")  # epoch 2 (15 steps an epoch), step 5
    # One process exits 75; torchrun, whose first worker to end ends the rest, exits non-zero: a retry either way.
    assert stopped.returncode == EXIT_CHECKPOINTED if procs == 1 else stopped.returncode != 0, stopped.stderr
    assert stopped.stdout.count("stopped on SIGTERM at epoch 2 step 5") == procs, stopped.stdout
    resumed = run_script(shards, tmp_path / "int", procs, "--workers", "1")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resumed from epoch 2 step 5 (SIGTERM checkpoint" in resumed.stdout + resumed.stderr
    ref = torch.load(tmp_path / "ref/model.pt", weights_only=True)
    res = torch.load(tmp_path / "int/model.pt", weights_only=True)
    assert all(torch.equal(ref[k], res[k]) for k in ref), "the resumed run's weights differ"


def test_two_ranks_train_what_one_does_up_to_rounding(shards, tmp_path: Path) -> None:
    for procs in (1, 2):
        proc = run_script(shards, tmp_path / str(procs), procs)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    one = torch.load(tmp_path / "1/model.pt", weights_only=True)
    two = torch.load(tmp_path / "2/model.pt", weights_only=True)
    assert all(torch.allclose(one[k], two[k], rtol=0, atol=1e-9) for k in one)


def test_shards_written_by_esols_writer_stored_are_read_in_place(tmp_path: Path) -> None:
    """A stored (uncompressed) .npz entry is read at its offset, zip64 headers included."""
    path = tmp_path / "big.npz"
    with (
        zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive,
        archive.open("y.npy", "w", force_zip64=True) as entry,
    ):
        np.lib.format.write_array(entry, np.arange(50.0))
    rows = ShardedRows([path], columns=["y"])
    assert rows.read(np.array([49, 0, 7]))["y"].tolist() == [49.0, 0.0, 7.0]


if __name__ == "__main__":
    sys.exit(main())
