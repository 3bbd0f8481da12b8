"""The public resume helper on a plain PyTorch loop that is not ESOL: stop, resume, continue, torchrun.

The loop below is what a user's own ``train.py`` looks like after adopting ``snakedvc.torch``;
this file also runs as that script (``python tests/test_resume.py ...``) for the torchrun test.
It has what makes an exact resume non-trivial: dropout drawn from the global RNG, seeded
differently on every rank, SGD with momentum, and a history kept in the checkpoint.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from snakedvc.torch import EXIT_CHECKPOINTED, Resumable, TrainingStopped, add_resume_arguments
from snakedvc.torch.distributed import session
from snakedvc.torch.options import CONTINUE_FROM_ENV, FINAL_STATE_ENV

BATCH = 16
N_SAMPLES = 256
STEPS_PER_EPOCH = N_SAMPLES // BATCH


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="a toy regression trained resumably")
    parser.add_argument("--data", required=True, help="a .pt file holding tensors X and y")
    parser.add_argument("--out", required=True, help="where rank 0 writes the final weights")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=int, default=2, help="checkpoints kept during training")
    parser.add_argument("--kill-at", type=int, help="send SIGTERM to this process after this many steps")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step (a slow run to interrupt)")
    add_resume_arguments(parser)
    return parser.parse_args(argv)


def train(argv: list[str]) -> list[float]:
    """The user's loop. Returns the history; rank 0 writes the final weights to --out."""
    args = parse(argv)
    with session() as ctx:
        torch.manual_seed(args.seed + ctx.rank)  # dropout differs per rank; checkpoints keep every rank's RNG
        data = torch.load(args.data, weights_only=True)
        X, y = data["X"], data["y"]
        model = nn.Sequential(nn.Linear(X.shape[1], 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        hparams = {"epochs": args.epochs, "lr": args.lr, "seed": args.seed}

        # -- the helper: five calls --
        resume = Resumable.from_args(args, hparams, inputs=[args.data], keep=args.keep, ctx=ctx)
        history: list[float] = []
        start = resume.load(model, optimizer, extra=lambda: {"history": history})
        history = start.extra.get("history", [])
        net = nn.parallel.DistributedDataParallel(model) if ctx.distributed else model
        done = 0
        for epoch in range(start.epoch, args.epochs):
            # Batch order: a pure function of (seed, epoch), the same on every rank.
            order = torch.randperm(len(X), generator=torch.Generator().manual_seed(args.seed * 1000 + epoch))
            net.train()
            for step, batch in resume.steps(order.split(BATCH), epoch):
                mine = batch[ctx.rank :: ctx.world_size]
                loss = ((net(X[mine]).squeeze(-1) - y[mine]) ** 2).mean()
                resume.add(loss=loss.item() * len(mine), samples=len(mine))  # this epoch's running sums
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                done += 1
                if done == args.kill_at:
                    os.kill(os.getpid(), signal.SIGTERM)  # what SLURM sends; the next step is where all ranks stop
                time.sleep(args.step_sleep)
                if ctx.is_main:
                    print(f"epoch {epoch} step {step} done", flush=True)  # where it is, for a test to aim at
            model.eval()
            with torch.no_grad():
                history.append(float(((model(X).squeeze(-1) - y) ** 2).mean()))
            # The epoch's mean training loss: a resumed epoch continues the sums of the steps before the stop.
            history.append(resume.sums["loss"] / resume.sums["samples"])
            if ctx.is_main:
                print(f"epoch {epoch} loss {history[-2]:.6f}", flush=True)
            resume.save()
        resume.finish()
        # -- end of the helper --

        if ctx.is_main:
            torch.save(model.state_dict(), args.out)
        return history


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


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    generator = torch.Generator().manual_seed(0)
    X = torch.randn(N_SAMPLES, 8, generator=generator)
    y = X @ torch.randn(8, generator=generator) + 0.1 * torch.randn(N_SAMPLES, generator=generator)
    path = tmp_path_factory.mktemp("data") / "data.pt"
    torch.save({"X": X, "y": y}, path)
    return path


def run(data: Path, out: Path, *extra: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    """One in-process run; checkpoints in out/ckpt unless --checkpoint-dir is given."""
    argv = ["--data", str(data), "--out", str(out / "model.pt"), "--checkpoint-dir", str(out / "ckpt"), *extra]
    history = train(argv)
    return history, torch.load(out / "model.pt", weights_only=True)


@pytest.fixture(scope="module")
def uninterrupted(data, tmp_path_factory) -> tuple[list[float], dict[str, torch.Tensor]]:
    return run(data, tmp_path_factory.mktemp("ref"))


def assert_identical(a: tuple[list[float], dict[str, torch.Tensor]], b) -> None:
    assert a[0] == b[0]
    assert a[1].keys() == b[1].keys()
    for name in a[1]:
        assert torch.equal(a[1][name], b[1][name]), name


def checkpoints(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "ckpt").glob("*/ckpt-*.pt"))


@pytest.mark.parametrize("kill_at", [3, 2 * STEPS_PER_EPOCH + 5, 6 * STEPS_PER_EPOCH - 2], ids=["first", "mid", "last"])
def test_sigterm_stops_at_the_next_step_and_the_rerun_is_bitwise_identical(
    data, uninterrupted, tmp_path: Path, kill_at: int, caplog
) -> None:
    with pytest.raises(TrainingStopped) as stopped:
        run(data, tmp_path, "--kill-at", str(kill_at))
    epoch, step = divmod(kill_at, STEPS_PER_EPOCH)  # stopped before running step kill_at (0-based)
    assert stopped.value.checkpoint is not None and stopped.value.checkpoint.is_file()
    assert stopped.value.checkpoint.name == f"ckpt-e{epoch:05d}-s{step:06d}.pt"
    assert f"stopped on SIGTERM at epoch {epoch} step {step}" in str(stopped.value)
    assert not (tmp_path / "model.pt").exists()
    with caplog.at_level(logging.INFO, logger="snakedvc"):
        resumed = run(data, tmp_path)
    assert f"resumed from epoch {epoch} step {step} (SIGTERM checkpoint" in caplog.text
    assert_identical(uninterrupted, resumed)
    assert checkpoints(tmp_path) == []  # removed at the end


def test_corrupt_newest_checkpoint_is_skipped_with_a_warning(data, uninterrupted, tmp_path: Path, caplog) -> None:
    with pytest.raises(TrainingStopped) as stopped:
        run(data, tmp_path, "--keep", "5", "--kill-at", str(3 * STEPS_PER_EPOCH + 4))
    newest = stopped.value.checkpoint
    assert newest is not None
    newest.write_bytes(newest.read_bytes()[:100])  # a write cut short, as by a full disk
    with caplog.at_level(logging.INFO, logger="snakedvc"):
        resumed = run(data, tmp_path, "--keep", "5")
    assert f"skipping unreadable checkpoint {newest}" in caplog.text
    assert "resumed from epoch 3 step 0 (periodic checkpoint" in caplog.text
    assert_identical(uninterrupted, resumed)


def test_checkpoint_of_other_params_is_never_used(data, uninterrupted, tmp_path: Path, caplog) -> None:
    other, mine = tmp_path / "other", tmp_path / "mine"
    with pytest.raises(TrainingStopped) as stopped:
        run(data, other, "--lr", "0.003", "--kill-at", "20")
    foreign = stopped.value.checkpoint
    assert foreign is not None
    # Other params, other folder: a run with the default lr does not even look there ...
    assert Resumable({"epochs": 6, "lr": 0.01, "seed": 0}, [data], root=other / "ckpt").store.dir != foreign.parent
    # ... and a checkpoint of theirs copied into its folder is skipped.
    key_dir = Resumable({"epochs": 6, "lr": 0.01, "seed": 0}, [data], root=mine / "ckpt").store.dir
    key_dir.mkdir(parents=True)
    (key_dir / foreign.name).write_bytes(foreign.read_bytes())
    with caplog.at_level(logging.INFO, logger="snakedvc"):
        result = run(data, mine)
    assert f"skipping checkpoint {key_dir / foreign.name}: it belongs to other params" in caplog.text
    assert "resumed from" not in caplog.text
    assert_identical(uninterrupted, result)


def test_continue_from_a_final_state_equals_training_straight_through(data, tmp_path: Path, caplog) -> None:
    straight = run(data, tmp_path / "straight", "--epochs", "6")
    short = run(data, tmp_path / "short", "--epochs", "3", "--final-state", str(tmp_path / "state.pt"))
    assert len(short[0]) == 2 * 3 and checkpoints(tmp_path / "short") == []
    with caplog.at_level(logging.INFO, logger="snakedvc"):
        longer = run(data, tmp_path / "longer", "--epochs", "6", "--continue-from", str(tmp_path / "state.pt"))
    assert f"continuing from epoch 3: the final state of an earlier run, {tmp_path / 'state.pt'}" in caplog.text
    assert_identical(straight, longer)
    assert not torch.equal(short[1]["0.weight"], longer[1]["0.weight"])


def test_continue_from_is_part_of_the_run_key(data, tmp_path: Path) -> None:
    run(data, tmp_path / "a", "--epochs", "2", "--final-state", str(tmp_path / "a.pt"))
    run(data, tmp_path / "b", "--epochs", "3", "--final-state", str(tmp_path / "b.pt"))
    params = {"epochs": 6, "lr": 0.01, "seed": 0}
    dirs = {Resumable(params, [data], continue_from=tmp_path / f"{n}.pt", root=tmp_path).store.dir for n in "ab"}
    assert len(dirs) == 2


def test_extra_state_may_not_overwrite_the_checkpoints_own_keys(tmp_path: Path) -> None:
    resume = Resumable({"lr": 1}, root=tmp_path)
    resume.load(nn.Linear(2, 1), extra=lambda: {"model": "mine"})
    with pytest.raises(ValueError, match="model"):
        resume.save(1)


def test_save_before_load_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="load"):
        Resumable({"lr": 1}, root=tmp_path).save()


# ---------------------------------------------------------------- the short form: epochs, log, finish


def train_short(data: Path, out: Path, epochs: int = 6, kill_at: int = 0, **options) -> dict[str, torch.Tensor]:
    """The tutorial's loop: Resumable(...), resume.epochs, resume.steps, resume.log, resume.finish."""
    torch.manual_seed(0)
    tensors = torch.load(data, weights_only=True)
    X, y = tensors["X"], tensors["y"]
    model = nn.Sequential(nn.Linear(X.shape[1], 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    resume = Resumable({"epochs": epochs}, inputs=[data], root=out / "ckpt", live=out / "live", **options)
    done = 0
    for epoch in resume.epochs(epochs, model, optimizer):
        order = torch.randperm(len(X), generator=torch.Generator().manual_seed(epoch))
        model.train()
        for _, batch in resume.steps(order.split(BATCH), epoch):
            loss = ((model(X[batch]).squeeze(-1) - y[batch]) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            done += 1
            if done == kill_at:
                os.kill(os.getpid(), signal.SIGTERM)
        model.eval()
        with torch.no_grad():
            resume.log(loss=float(((model(X).squeeze(-1) - y) ** 2).mean()))
    resume.finish(final_loss=1.5)
    return {name: value.clone() for name, value in model.state_dict().items()}


@pytest.mark.parametrize("kill_at", [STEPS_PER_EPOCH, 3 * STEPS_PER_EPOCH + 5], ids=["epoch-end", "mid-epoch"])
def test_the_short_form_resumes_bit_for_bit_and_logs_every_epoch_once(data, tmp_path: Path, kill_at, caplog) -> None:
    from tests.conftest import folder_files  # here: this file also runs as a script, without the tests package

    straight = train_short(data, tmp_path / "straight")
    with pytest.raises(TrainingStopped):
        train_short(data, tmp_path / "stopped", kill_at=kill_at)
    with caplog.at_level(logging.INFO, logger="snakedvc"):
        resumed = train_short(data, tmp_path / "stopped")
    assert "resumed from epoch" in caplog.text
    assert re.search(r"epoch 6: loss \d", caplog.text)  # resume.log's line
    assert straight.keys() == resumed.keys() and all(torch.equal(straight[k], resumed[k]) for k in straight)
    # dvclive's folder: every epoch once, as the straight run's (the rows came back with the checkpoint).
    assert folder_files(tmp_path / "stopped/live") == folder_files(tmp_path / "straight/live")
    assert json.loads((tmp_path / "straight/live/metrics.json").read_text())["final_loss"] == 1.5
    assert checkpoints(tmp_path / "stopped") == []


def test_the_short_form_takes_a_trials_states_from_launchs_environment(data, tmp_path: Path, monkeypatch) -> None:
    from tests.conftest import folder_files

    straight = train_short(data, tmp_path / "straight", epochs=6)
    monkeypatch.setenv(FINAL_STATE_ENV, str(tmp_path / "rung0.pt"))
    train_short(data, tmp_path / "rung0", epochs=3)
    assert (tmp_path / "rung0.pt").is_file()
    monkeypatch.setenv(FINAL_STATE_ENV, str(tmp_path / "rung1.pt"))
    monkeypatch.setenv(CONTINUE_FROM_ENV, str(tmp_path / "rung0.pt"))
    longer = train_short(data, tmp_path / "rung1", epochs=6)
    assert all(torch.equal(straight[k], longer[k]) for k in straight)
    # The curve continues across rungs: rung 1's folder holds epochs 1..6, as the straight run's.
    assert folder_files(tmp_path / "rung1/live") == folder_files(tmp_path / "straight/live")


def test_launch_hands_the_states_to_the_command_in_its_environment(tmp_path: Path) -> None:
    show = "import os; print(os.environ['SNAKEDVC_CONTINUE_FROM'], os.environ['SNAKEDVC_FINAL_STATE'])"
    proc = subprocess.run(
        [sys.executable, "-m", "snakedvc", "launch", "--continue-from", "a/s.pt", "--final-state", "b/s.pt",
         "--", sys.executable, "-c", show],
        cwd=tmp_path, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert proc.stdout.split() == [str(tmp_path / "a/s.pt"), str(tmp_path / "b/s.pt")]


def test_log_outside_an_epoch_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="inside resume.epochs"):
        Resumable({"lr": 1}, root=tmp_path).log(loss=1.0)


def worker_of_rank(torchrun: int, rank: str) -> int:
    """The pid of torchrun's worker process of ``rank`` (its RANK in its environment)."""
    for child in Path(f"/proc/{torchrun}/task/{torchrun}/children").read_text().split():
        environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        if f"RANK={rank}".encode() in environ:
            return int(child)
    raise AssertionError(f"no worker of rank {rank} under torchrun {torchrun}")


@pytest.mark.slow
@pytest.mark.parametrize("to", ["torchrun", "rank 1"])
def test_sigterm_to_torchrun_stops_both_ranks_at_one_step_and_the_rerun_matches(data, tmp_path: Path, to: str) -> None:
    """Real signals: SIGTERM to torchrun mid-run (or to one worker alone: a rank whose own signal is
    late, as on two nodes under load); both ranks stop at one step, both naming the signal; the rerun
    resumes exactly."""
    from tests.conftest import venv_env  # here: this file also runs as a script, without the tests package
    from tests.waiting import wait_until

    def command(out: Path) -> list[str]:
        return [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
            "--no-python", "python", __file__, "--data", str(data), "--out", str(out / "model.pt"),
            "--checkpoint-dir", str(out / "ckpt"), "--epochs", "8", "--step-sleep", "0.02",
        ]  # fmt: skip

    def launch(out: Path, name: str) -> tuple[subprocess.Popen[bytes], Path]:
        out.mkdir(exist_ok=True)
        log = out / f"{name}.log"
        with open(log, "wb") as handle:
            proc = subprocess.Popen(command(out), env=venv_env(), stdout=handle, stderr=subprocess.STDOUT)
        return proc, log

    reference, interrupted = tmp_path / "ref", tmp_path / "int"
    proc, ref_log = launch(reference, "run")
    assert proc.wait(timeout=600) == 0, ref_log.read_text()

    proc, log = launch(interrupted, "first")
    # Mid-epoch (any step will do): the signal lands a step or two later, well before the run's end.
    mid_epoch = f"epoch 3 step {STEPS_PER_EPOCH // 2} done"
    wait_until(lambda: mid_epoch in log.read_text(), repr(mid_epoch), 300, 0.05, explain=log.read_text, proc=proc)
    if to == "torchrun":
        proc.send_signal(signal.SIGTERM)  # to torchrun alone, which passes it on to its workers
    else:
        os.kill(worker_of_rank(proc.pid, "1"), signal.SIGTERM)  # rank 0 hears of it only from rank 1
    assert proc.wait(timeout=120) != 0  # non-zero: Snakemake would retry
    text = log.read_text()
    assert "epoch 7 loss" not in text, "the run ended before the signal: nothing was interrupted"
    assert text.count("received SIGTERM") == (2 if to == "torchrun" else 1), text
    # Both ranks took the checkpoint-and-stop path at the same step (and exit 75 there).
    stops = re.findall(r"rank (\d): stopped on SIGTERM at epoch (\d+) step (\d+)", text)
    assert sorted(rank for rank, _, _ in stops) == ["0", "1"], text
    assert len({(epoch, step) for _, epoch, step in stops}) == 1, stops
    epoch, step = int(stops[0][1]), int(stops[0][2])
    assert f"ckpt-e{epoch:05d}-s{step:06d}.pt" in checkpoints(interrupted)
    assert not (interrupted / "model.pt").exists()

    proc, log = launch(interrupted, "rerun")
    assert proc.wait(timeout=600) == 0, log.read_text()
    assert f"resumed from epoch {epoch} step {step} (SIGTERM checkpoint" in log.read_text()
    ref = torch.load(reference / "model.pt", weights_only=True)
    res = torch.load(interrupted / "model.pt", weights_only=True)
    assert all(torch.equal(ref[k], res[k]) for k in ref)
    losses = re.compile(r"^epoch \d+ loss \S+$", re.MULTILINE)
    assert losses.findall(ref_log.read_text())[epoch:] == losses.findall(log.read_text())
    assert checkpoints(interrupted) == []


if __name__ == "__main__":
    sys.exit(main())


def test_a_folder_of_shards_is_an_input_hashed_file_by_file(tmp_path: Path) -> None:
    """`Resumable(vars(args), inputs=[args.data])` with a folder of shards (it raised IsADirectoryError)."""
    shards = tmp_path / "shards"
    (shards / "part").mkdir(parents=True)
    (shards / "a.npy").write_bytes(b"first")
    (shards / "part" / "b.npy").write_bytes(b"second")
    params = {"lr": 0.01}

    def key_dir() -> Path:
        return Resumable(params, [shards], root=tmp_path / "ckpt").store.dir

    first = key_dir()
    assert first == key_dir()  # the same bytes, the same run
    (shards / "part" / "b.npy").write_bytes(b"changed")
    assert key_dir() != first
    (shards / "part" / "b.npy").write_bytes(b"second")
    assert key_dir() == first
    (shards / "part" / "b.npy").rename(shards / "part" / "c.npy")  # a renamed shard: another run
    assert key_dir() != first
    with pytest.raises(FileNotFoundError, match=r"input .*missing does not exist"):
        Resumable(params, [tmp_path / "missing"], root=tmp_path / "ckpt")


def test_n_processes_without_a_process_group_are_told_what_to_add(tmp_path: Path) -> None:
    """Under torchrun (WORLD_SIZE 2) with no process group, training stops before its first step with
    what to add (issue 50: a single-process script run with procs=2 met torch's "Default process
    group has not been initialized" instead)."""
    from snakedvc.torch import NoProcessGroup, StopRequest
    from snakedvc.torch.distributed import DistContext

    ctx = DistContext(rank=1, world_size=2, backend="gloo")
    resume = Resumable({"lr": 0.1}, root=tmp_path / "checkpoints", stop=StopRequest(signals=()), ctx=ctx)
    with pytest.raises(NoProcessGroup, match=r"rank 1 of 2 .* has no process group: .*DistributedDataParallel"):
        next(resume.epochs(3, nn.Linear(2, 1)))


EDITABLE_SCRIPT = """\
import os, signal, sys
import torch
from torch import nn
from snakedvc.torch import Resumable

kill_at = int(sys.argv[1])
torch.manual_seed(0)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
resume = Resumable({"epochs": 4}, root="ckpt")
done = 0
for epoch in resume.epochs(4, model, optimizer):
    for _, step in resume.steps(range(5), epoch):
        if done == kill_at:
            os.kill(os.getpid(), signal.SIGTERM)
        done += 1
        loss = model(torch.ones(2, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
resume.finish()
"""


def test_a_checkpoint_of_other_code_is_never_resumed(tmp_path: Path) -> None:
    """The script edited after a SIGTERM: its rerun starts anew, as the code is part of the run's
    key (issue 50's trial: an edited, committed train.py resumed from its old self's checkpoint,
    and the experiment held epochs of both). The same code resumes."""
    script = tmp_path / "train.py"
    script.write_text(EDITABLE_SCRIPT)

    def train(kill_at: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(script), str(kill_at)], cwd=tmp_path, capture_output=True,
                              text=True, timeout=300)  # fmt: skip

    assert train(7).returncode == EXIT_CHECKPOINTED
    again = train(-1)
    assert again.returncode == 0 and "resumed from epoch 2 step 3" in again.stderr, again.stderr
    assert train(7).returncode == EXIT_CHECKPOINTED
    script.write_text(EDITABLE_SCRIPT.replace("lr=0.1", "lr=0.05"))
    edited = train(-1)
    assert edited.returncode == 0 and "resumed from" not in edited.stderr, edited.stderr
