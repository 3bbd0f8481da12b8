"""Train a small MLP on the digits splits that prepare.py wrote; report valid and test accuracy.

    python train.py --hparams '{"epochs": 20, "lr": 0.003, ...}' --data results/data/digits.npz \
        --model results/model.pt --metrics results/metrics.json --live results/live

Resumable: a checkpoint after every epoch, and on SIGTERM (SLURM's warning before the time
limit, scancel, preemption) one at the current step, then exit 75. The same command run again
resumes there and ends with the same weights, bit for bit. Under torchrun (N processes) every
process takes 1/N of each batch (DistributedDataParallel); one process otherwise.
"""

import argparse
import json
import logging
import os
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from snakedvc.torch import Resumable

log = logging.getLogger("digits")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hparams", type=json.loads, required=True, help="the config's train section, as JSON")
    parser.add_argument("--data", required=True, help="the .npz file prepare.py wrote")
    parser.add_argument("--model", required=True, help="where to write the trained weights")
    parser.add_argument(
        "--metrics",
        required=True,
        help="where to write the accuracies (JSON); the test confusion matrix goes beside it",
    )
    parser.add_argument("--live", required=True, help="dvclive folder: hyperparameters and per-epoch metrics")
    return parser.parse_args()


def evaluate(model: nn.Module, X: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Mean cross-entropy and accuracy."""
    model.eval()
    with torch.no_grad():
        logits = model(X)
        return F.cross_entropy(logits, y).item(), (logits.argmax(1) == y).float().mean().item()


def plot_confusion(model: nn.Module, X: torch.Tensor, y: torch.Tensor, path: Path) -> None:
    """The test set's confusion matrix (true digit x predicted digit) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    model.eval()
    with torch.no_grad():
        predicted = model(X).argmax(1).cpu().numpy()
    counts = np.zeros((10, 10), dtype=int)
    np.add.at(counts, (y.cpu().numpy(), predicted), 1)
    fig, ax = plt.subplots(figsize=(4.5, 4))
    ax.imshow(counts, cmap="Blues")
    for (i, j), n in np.ndenumerate(counts):
        if n:
            ax.text(
                j, i, str(n), ha="center", va="center", fontsize=7, color="white" if n > counts.max() / 2 else "black"
            )
    ax.set(
        xlabel="predicted digit", ylabel="true digit", xticks=range(10), yticks=range(10), title="Test confusion matrix"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def train(args: argparse.Namespace) -> None:
    hp = args.hparams
    torch.manual_seed(hp["seed"])  # weights and dropout
    # Unused here, but kept in every checkpoint by Resumable: seeded, a run's checkpoints are the
    # same bytes each time (a sweep's replay compares them).
    random.seed(hp["seed"])
    np.random.seed(hp["seed"])
    torch.set_num_threads(1)  # the same sums in the same order on every host: bit-reproducible
    torch.use_deterministic_algorithms(True)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))  # set by torchrun
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', 0)}" if cuda else "cpu")
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo")

    data = np.load(args.data)
    X = {s: torch.from_numpy(data[f"X_{s}"]).to(device) for s in ("train", "valid", "test")}
    y = {s: torch.from_numpy(data[f"y_{s}"]).to(device) for s in ("train", "valid", "test")}
    model = nn.Sequential(
        nn.Linear(X["train"].shape[1], hp["hidden"]),
        nn.ReLU(),
        nn.Dropout(hp["dropout"]),
        nn.Linear(hp["hidden"], 10),
    ).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=hp["lr"], weight_decay=hp["weight_decay"])

    # Checkpoints are keyed by the hyperparameters and the data's bytes: other ones never resume
    # from them. Per-epoch metrics go to dvclive's files (written by process 0 as each epoch
    # ends); the epochs logged so far travel in the checkpoint, so a resumed run's folder is a
    # straight run's. A sweep trial's states come through `snakedvc launch`.
    resume = Resumable(hp, inputs=[args.data], live=args.live)
    net = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    for epoch in resume.epochs(hp["epochs"], model, optimizer):  # from the newest checkpoint
        # The batch order is a pure function of (seed, epoch), the same on every process: a resume replays it.
        order = torch.randperm(len(X["train"]), generator=torch.Generator().manual_seed(hp["seed"] * 1000 + epoch))
        net.train()
        for _step, batch in resume.steps(order.split(hp["batch_size"]), epoch):
            started = time.monotonic()
            mine = batch[rank::world].to(device)
            # Scaled so that DDP's average over processes is the mean over the whole batch.
            loss = F.cross_entropy(net(X["train"][mine]), y["train"][mine], reduction="sum") * world / len(batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            # A stand-in for a bigger model's step time (benchmarks of a sweep's scheduling); the
            # weights are an unpadded run's.
            time.sleep(max(0.0, hp["min_step_seconds"] - (time.monotonic() - started)))
        train_loss, _ = evaluate(model, X["train"], y["train"])
        _, valid_accuracy = evaluate(model, X["valid"], y["valid"])
        resume.log(train_loss=train_loss, valid_accuracy=valid_accuracy)
    metrics = {
        "valid_accuracy": evaluate(model, X["valid"], y["valid"])[1],
        "test_accuracy": evaluate(model, X["test"], y["test"])[1],
        "epochs": hp["epochs"],
    }
    # The final state (a sweep's next rung continues from it); checkpoints removed; the test
    # accuracy beside the last epoch's metrics in dvclive's summary.
    resume.finish(test_accuracy=metrics["test_accuracy"])
    if rank == 0:
        write_results(args, model, X, y, metrics)


def write_results(args: argparse.Namespace, model: nn.Module, X: dict, y: dict, metrics: dict) -> None:
    """The model, its metrics and the test confusion matrix (process 0 only)."""
    torch.save({key: value.cpu() for key, value in model.state_dict().items()}, args.model)
    with open(args.metrics, "w") as handle:
        json.dump(metrics, handle, indent=2, sort_keys=True)
    plot_confusion(model, X["test"], y["test"], Path(args.metrics).with_name("confusion.png"))
    log.info("valid accuracy %.4f, test accuracy %.4f", metrics["valid_accuracy"], metrics["test_accuracy"])


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic matmuls on CUDA
    try:
        # On SIGTERM: checkpointed and logged, then TrainingStopped, a SystemExit(75); a rerun resumes.
        train(parse_args())
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
