"""Accuracy of the trained model on the test features, and its predictions for DVC's plots.

python src/evaluate.py MODEL.pt FEATURES.npz OUTPUT_FOLDER
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch


def main() -> None:
    model_file, features, output = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    saved = torch.load(model_file)
    model = torch.nn.Sequential(
        torch.nn.Linear(saved["inputs"], saved["hidden"]), torch.nn.ReLU(), torch.nn.Linear(saved["hidden"], 1)
    )
    model.load_state_dict(saved["state_dict"])
    data = np.load(features)
    with torch.no_grad():
        predicted = (model(torch.from_numpy(data["X"])).squeeze(1) > 0).long().numpy()
    actual = data["y"]
    output.mkdir(parents=True, exist_ok=True)
    accuracy = float((predicted == actual).mean())
    (output / "metrics.json").write_text(json.dumps({"accuracy": round(accuracy, 4)}) + "\n")
    rows = ["actual,predicted", *(f"{a},{p}" for a, p in zip(actual, predicted, strict=True))]
    (output / "predictions.csv").write_text("\n".join(rows) + "\n")
    print(f"test accuracy: {accuracy:.4f}")


if __name__ == "__main__":
    main()
