"""Split scikit-learn's bundled digits (1797 8x8 grey images, 10 classes; no download) into
train / valid / test, stratified and seeded, and write the three splits to one .npz file.

    python prepare.py --valid-fraction 0.15 --test-fraction 0.15 --seed 0 --output data.npz
"""

import argparse
import io
import zipfile

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--valid-fraction", type=float, required=True)
    parser.add_argument("--test-fraction", type=float, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--output", required=True, help="the .npz file (X_train, y_train, X_valid, ...)")
    args = parser.parse_args()

    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).astype(np.float32)  # pixel values 0..16 -> 0..1
    y = y.astype(np.int64)
    X_rest, X_test, y_rest, y_test = train_test_split(
        X, y, test_size=args.test_fraction, random_state=args.seed, stratify=y
    )
    X_train, X_valid, y_train, y_valid = train_test_split(
        X_rest,
        y_rest,
        test_size=args.valid_fraction / (1 - args.test_fraction),
        random_state=args.seed,
        stratify=y_rest,
    )
    splits = {"train": (X_train, y_train), "valid": (X_valid, y_valid), "test": (X_test, y_test)}

    # np.savez stamps each member with the current time: write the zip with a fixed one instead,
    # so the same split is the same bytes (one DVC version, one checkpoint key).
    with zipfile.ZipFile(args.output, "w") as archive:
        for name, (features, labels) in splits.items():
            for key, array in ((f"X_{name}", features), (f"y_{name}", labels)):
                buffer = io.BytesIO()
                np.save(buffer, array)
                archive.writestr(zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0)), buffer.getvalue())
    print(", ".join(f"{name}: {len(labels)} images" for name, (_, labels) in splits.items()))


if __name__ == "__main__":
    main()
