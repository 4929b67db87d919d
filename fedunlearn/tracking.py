"""Optional experiment tracking: the rows of ``metrics.csv`` and each request's comparison also go
to TensorBoard event files and to an MLflow run, when the run config asks for them.

* ``log-tensorboard = true``: event files under ``RUN/tensorboard/`` (``tensorboard --logdir
  RUN/tensorboard``); each training round's metrics as scalars ``train/<column>`` at step = the
  round; each request's comparison as ``unlearning/<method>/<column>`` at step = the request.
* ``log-mlflow = URI``: one MLflow run per run directory (its id kept in ``RUN/mlflow.json``, so a
  later request or a resumed run logs to the same MLflow run); the same metrics, with the rounds as
  steps, and each method's text columns (``did``, ``flag``) as tags. ``run`` stands for a SQLite
  store in the run directory (``sqlite:///RUN/mlflow.db``; MLflow 3 keeps its file store in
  maintenance mode only); any other value is a tracking URI (``http://host:5000``).

Neither package is a dependency of fedunlearn: ``pip install fedunlearn[tensorboard]``,
``fedunlearn[mlflow]`` (:data:`EXTRAS`); a run asking for one that is missing is refused when its
configuration is validated (:func:`missing_module`). Flower-free; imports its backends lazily.
"""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

#: The run-config key of each backend: (the module it imports, the extra that installs it).
EXTRAS = {"log-tensorboard": ("tensorboard", "tensorboard"), "log-mlflow": ("mlflow", "mlflow")}
#: ``log-mlflow`` for a SQLite store in the run directory.
IN_RUN = "run"
TENSORBOARD_FOLDER = "tensorboard"
MLFLOW_FILE = "mlflow.json"
MLFLOW_EXPERIMENT = "fedunlearn"
#: metrics.csv columns that are no measurement of the round.
_NOT_METRICS = {"round"}


def missing_module(key: str) -> str | None:
    """What to install for ``key``'s backend when its module is missing, else None."""
    module, extra = EXTRAS[key]
    if importlib.util.find_spec(module) is not None:
        return None
    return f"{module} is not installed: pip install 'fedunlearn[{extra}]'"


def mlflow_uri(value: str, run_path: Path) -> str:
    """The tracking URI ``log-mlflow = value`` names for the run directory ``run_path``."""
    return f"sqlite:///{Path(run_path).resolve() / 'mlflow.db'}" if value == IN_RUN else value


def numeric_items(row: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of ``row`` (booleans as 0/1); text, blanks and NaN are left out."""
    out = {}
    for key, value in row.items():
        if isinstance(value, bool):
            out[key] = float(value)
        elif isinstance(value, int | float) or hasattr(value, "__float__"):
            try:
                number = float(value)
            except (TypeError, ValueError):
                continue
            if math.isfinite(number):
                out[key] = number
    return out


class Tracker:
    """The run's trackers: a TensorBoard writer, an MLflow run, both or none (then every call does
    nothing). Open with :func:`open_tracker`; :meth:`close` when the phase ends.

    Parameters
    ----------
    run_path : Path
        The run directory.
    tensorboard : bool
        Write event files under ``run_path / "tensorboard"``.
    mlflow : str
        The run config's ``log-mlflow`` ("": off).
    params : Mapping or None
        The run config, logged once as the MLflow run's parameters.
    """

    def __init__(
        self,
        run_path: Path,
        *,
        tensorboard: bool = False,
        mlflow: str = "",
        params: Mapping[str, Any] | None = None,
    ) -> None:
        self.run_path = Path(run_path)
        self._writer = self._tensorboard() if tensorboard else None
        self._mlflow, self._run_id = (None, None)
        if mlflow:
            self._mlflow, self._run_id = self._mlflow_run(mlflow_uri(mlflow, run_path), params)

    @property
    def active(self) -> bool:
        return self._writer is not None or self._mlflow is not None

    def log_round(self, row: Mapping[str, Any]) -> None:
        """One ``metrics.csv`` row: its numbers at step = its ``round``."""
        step = int(row["round"])
        values = {k: v for k, v in numeric_items(row).items() if k not in _NOT_METRICS}
        self._scalars({f"train/{k}": v for k, v in values.items()}, step)

    def log_comparison(self, rows: Iterable[Mapping[str, Any]], *, request: int = 1) -> None:
        """A request's comparison (one row per method, ``method`` naming it): its numbers at step
        = ``request``, its texts as MLflow tags."""
        for row in rows:
            method = str(row["method"])
            values = {k: v for k, v in numeric_items(row).items() if k != "method"}
            self._scalars({f"unlearning/{method}/{k}": v for k, v in values.items()}, request)
            texts = {k: str(v) for k, v in row.items() if isinstance(v, str) and k != "method"}
            if self._mlflow is not None and texts:
                for key, text in texts.items():
                    name = f"unlearning.{method}.{key}" + (f".{request}" if request > 1 else "")
                    self._mlflow.set_tag(self._run_id, name, text[:5000])

    def close(self) -> None:
        """Flush and close the event files, and mark the MLflow run finished (a later phase, a
        later request, logs to it again)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._mlflow is not None:
            self._mlflow.set_terminated(self._run_id)
            self._mlflow = None

    def _scalars(self, values: Mapping[str, float], step: int) -> None:
        if self._writer is not None:
            for tag, value in values.items():
                self._writer.add_scalar(tag, value, step)
            self._writer.flush()
        if self._mlflow is not None and values:
            from mlflow.entities import Metric

            stamp = _now_ms()
            metrics = [Metric(_mlflow_name(t), v, stamp, step) for t, v in values.items()]
            self._mlflow.log_batch(self._run_id, metrics=metrics)

    def _tensorboard(self):
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(log_dir=str(self.run_path / TENSORBOARD_FOLDER))

    def _mlflow_run(self, uri: str, params: Mapping[str, Any] | None):
        """(client, run id): the run directory's MLflow run at ``uri``, created on first use."""
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        record = self.run_path / MLFLOW_FILE
        if record.is_file():
            kept = json.loads(record.read_text(encoding="utf-8"))
            if kept.get("tracking_uri") == uri:
                return client, kept["run_id"]
        found = client.get_experiment_by_name(MLFLOW_EXPERIMENT)
        experiment = found.experiment_id if found else client.create_experiment(MLFLOW_EXPERIMENT)
        run = client.create_run(experiment, run_name=self.run_path.name)
        if params:
            from mlflow.entities import Param

            pairs = [Param(k, str(v)[:6000]) for k, v in sorted(params.items())]
            for start in range(0, len(pairs), 100):  # MLflow takes 100 parameters a batch
                client.log_batch(run.info.run_id, params=pairs[start : start + 100])
        record.write_text(json.dumps({"tracking_uri": uri, "run_id": run.info.run_id}))
        return client, run.info.run_id


def _mlflow_name(tag: str) -> str:
    """A TensorBoard tag as an MLflow metric name (``train/test_accuracy`` stays: ``/`` is
    allowed; anything else MLflow refuses becomes ``_``)."""
    return "".join(c if c.isalnum() or c in "_-. /" else "_" for c in tag)


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)


def open_tracker(config, run_path: Path) -> Tracker:
    """The trackers ``config`` (an :class:`~fedunlearn.config.ExperimentConfig`) asks for, for
    the run directory ``run_path``."""
    return Tracker(
        run_path,
        tensorboard=config.log_tensorboard,
        mlflow=config.log_mlflow,
        params=config.to_run_config() if config.log_mlflow else None,
    )
