"""Train a small PyTorch MLP (benign or malignant) on the train features.

python src/train.py FEATURES.npz MODEL.pt      (params.yaml: train.epochs, lr, hidden, seed)
"""

import sys
from pathlib import Path

import numpy as np
import torch
import yaml


def main() -> None:
    features, output = Path(sys.argv[1]), Path(sys.argv[2])
    params = yaml.safe_load(Path("params.yaml").read_text())["train"]
    torch.manual_seed(params["seed"])
    torch.set_num_threads(1)  # the same sums in the same order on any machine: the same model bytes
    data = np.load(features)
    X, y = torch.from_numpy(data["X"]), torch.from_numpy(data["y"]).float()
    model = torch.nn.Sequential(
        torch.nn.Linear(X.shape[1], params["hidden"]), torch.nn.ReLU(), torch.nn.Linear(params["hidden"], 1)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=params["lr"])
    for epoch in range(1, params["epochs"] + 1):
        optimizer.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(X).squeeze(1), y)
        loss.backward()
        optimizer.step()
        if epoch % 10 == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f}")
    torch.save({"state_dict": model.state_dict(), "inputs": X.shape[1], "hidden": params["hidden"]}, output)


if __name__ == "__main__":
    main()
