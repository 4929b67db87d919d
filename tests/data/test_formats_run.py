"""Data in common forms runs the main job's comparison with no code: scikit-learn's digits written
as a folder of PNGs per class, as a CSV with a label column and as an ``.npz``, each named by
``dataset`` and ``data-root`` only, trained, unlearned (FedEraser, FedRetrain) and compared by the
whole ServerApp (in this process, against the real ClientApp)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from federation_grid import serve_in_process

pytestmark = pytest.mark.usefixtures("flower_task_identity")


def _digits():
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.images.astype(np.float32), bunch.target.astype(np.int64)


def _image_folder(folder):
    from PIL import Image

    images, labels = _digits()
    for index, (image, label) in enumerate(zip(images[:600], labels[:600], strict=True)):
        target = folder / f"digit-{label}"
        target.mkdir(parents=True, exist_ok=True)
        Image.fromarray((image * 255 / 16).astype(np.uint8), mode="L").save(target / f"{index}.png")
    return {"dataset": "image-folder", "data-root": str(folder)}


def _table(folder):
    images, labels = _digits()
    frame = pd.DataFrame(images.reshape(len(images), -1), columns=[f"pixel{i}" for i in range(64)])
    frame.insert(0, "digit", labels)
    frame.to_csv(folder / "digits.csv", index=False)
    return {"dataset": "table", "data-root": str(folder / "digits.csv"), "label-column": "digit"}


def _npz(folder):
    images, labels = _digits()
    np.savez(folder / "digits.npz", x=images / 16.0, y=labels)
    return {"dataset": "npz", "data-root": str(folder / "digits.npz")}


@pytest.mark.parametrize(
    "write", [_image_folder, _table, _npz], ids=["image-folder", "table", "npz"]
)
def test_a_file_format_runs_the_main_jobs_comparison_with_no_code(write, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    run = {
        **write(data),
        "num-clients": 3,
        "rounds": 2,
        "local-epochs": 1,
        "retain-interval": 1,
        "unlearn-clients": "1",
        "unlearn-methods": "federaser,fedretrain",
        "output-dir": str(tmp_path / "runs"),
        "run-name": "format",
        "node-wait-seconds": 30,
    }
    serve_in_process(run, num_supernodes=3)
    folder = tmp_path / "runs" / "format"
    table = pd.read_csv(folder / "unlearning.csv").set_index("method")
    assert list(table.index) == ["fedavg", "federaser", "fedretrain"]
    assert (table["test_accuracy"] > 0.3).all(), table["test_accuracy"]  # chance is 0.1
    assert (folder / "unlearning.png").is_file()
