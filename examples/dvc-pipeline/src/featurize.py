"""Scale one split's measurements to [0, 1] with the train set's range, and drop the features
whose train-set variance is below featurize.min_variance.

    python src/featurize.py PREPARED_FOLDER SPLIT OUTPUT.npz
"""

import io
import sys
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import yaml


def main() -> None:
    prepared, split, output = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    params = yaml.safe_load(Path("params.yaml").read_text())["featurize"]
    train = pd.read_csv(prepared / "train.csv")
    rows = pd.read_csv(prepared / f"{split}.csv")
    features = [column for column in train.columns if column != "target"]
    low, high = train[features].min(), train[features].max()
    kept = [
        name
        for name in features
        if ((train[name] - low[name]) / (high[name] - low[name])).var() >= params["min_variance"]
    ]
    X = ((rows[kept] - low[kept]) / (high[kept] - low[kept])).to_numpy(np.float32)
    y = rows["target"].to_numpy(np.int64)
    output.parent.mkdir(parents=True, exist_ok=True)
    # np.savez stamps each member with the time: a fixed one keeps the same features the same bytes.
    with zipfile.ZipFile(output, "w") as archive:
        for key, array in (("X", X), ("y", y)):
            buffer = io.BytesIO()
            np.save(buffer, array)
            archive.writestr(zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0)), buffer.getvalue())
    print(f"{split}: {len(y)} rows, {len(kept)} of {len(features)} features")


if __name__ == "__main__":
    main()
