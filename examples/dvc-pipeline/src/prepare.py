"""Split scikit-learn's bundled breast-cancer data (569 tumours, 30 measurements, benign or
malignant; no download) into a train and a test set, stratified and seeded.

    python src/prepare.py OUTPUT_FOLDER      (params.yaml: prepare.test_fraction, prepare.seed)
"""

import sys
from pathlib import Path

import yaml
from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split


def main() -> None:
    output = Path(sys.argv[1])
    params = yaml.safe_load(Path("params.yaml").read_text())["prepare"]
    data = load_breast_cancer(as_frame=True).frame
    train, test = train_test_split(
        data, test_size=params["test_fraction"], random_state=params["seed"], stratify=data["target"]
    )
    output.mkdir(parents=True, exist_ok=True)
    train.to_csv(output / "train.csv", index=False)
    test.to_csv(output / "test.csv", index=False)
    print(f"train: {len(train)} rows, test: {len(test)} rows")


if __name__ == "__main__":
    main()
