"""Check a whole run directory the way its next request will read it: the run identity, every log's
chain, every model file's seal, and the store (its header bound to its index and run, its index rows,
optionally every blob, the retention record and the policies' states).

``fedunlearn store verify RUN`` prints :func:`run_problems`; an ``unlearn-only`` request refuses to
start on a run with any (:func:`refuse_unsound_run`, from the launcher's preflight and from the
ServerApp), naming the file and the field, so that no method acts on a record that is not this run's.
"""

from __future__ import annotations

from pathlib import Path

from fedunlearn.errors import ConfigError

#: What reading a damaged file may raise: our own errors (FedUnlearnError), and whatever a parser of
#: a damaged file raises (safetensors' SafetensorError is a bare Exception subclass): any Exception.
_READ_ERRORS = Exception


def run_problems(path: str | Path, *, blobs: bool = True) -> tuple[list[str], dict[str, int]]:
    """(one line per problem, what was checked: counts of logs, models and blobs) of the run in
    ``path``; never raises for a damaged file. ``blobs=False`` leaves out hashing every blob (each
    is verified when a method reads it)."""
    from fedunlearn.store.run_directory import RunDirectory
    from fedunlearn.store.sealing import sealer_of

    path = Path(path)
    try:
        sealer_of(path)
    except _READ_ERRORS as error:
        return [str(error)], {"logs": 0, "models": 0, "blobs": 0}
    run = RunDirectory(path)
    problems, checked = [], {"logs": 0, "models": 0, "blobs": 0}
    problems += _log_problems(run, checked)
    problems += _model_problems(run, checked)
    if (run.store_path / "store.json").is_file():
        problems += store_problems(run.store_path, checked, blobs=blobs)
    return problems, checked


def _log_problems(run, checked: dict[str, int]) -> list[str]:
    problems = []
    for log in sorted(run.path.glob("*.jsonl")):
        checked["logs"] += 1
        try:
            run.read_log(log.name)
        except _READ_ERRORS as error:
            problems.append(str(error))
    return problems


def _model_problems(run, checked: dict[str, int]) -> list[str]:
    from fedunlearn.store.run_directory import CHECKPOINT

    problems = []
    for model in sorted(run.path.glob("*.safetensors")):
        checked["models"] += 1
        try:
            run.load_checkpoint() if model.stem == CHECKPOINT else run.load_model(model.stem)
        except _READ_ERRORS as error:
            problems.append(str(error))
    return problems


def store_problems(root: Path, checked: dict[str, int], *, blobs: bool = True) -> list[str]:
    """The store's problems: opening it (header, index, identity), its rows (and blobs), then its
    history as the methods read it (retention record, policy states)."""
    from fedunlearn.registry import retention_policies
    from fedunlearn.store.history import policy_state_problems, record_problems
    from fedunlearn.store.update_store import UpdateStore

    try:
        store = UpdateStore(root, readonly=True)
    except _READ_ERRORS as error:
        return [str(error)]
    with store:
        problems = store.verify() if blobs else store.row_problems()
        checked["blobs"] += store.blob_count() if blobs else 0
        if not problems:
            problems = record_problems(store)
            problems += policy_state_problems(store.metadata, retention_policies())
    return problems


def refuse_unsound_run(path: str | Path, parameter: str = "run-name", value: object = None) -> None:
    """Refuse a request on the run in ``path`` when any record of it fails its check (the first
    problem named, the count of the others), before anything is read or written."""
    problems, _ = run_problems(path, blobs=False)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ConfigError(
            parameter,
            value if value is not None else Path(path).name,
            f"a run whose records all pass their checks; {problems[0]}{more}. Nothing was "
            f"started; `fedunlearn store verify {path}` lists every problem",
        )
