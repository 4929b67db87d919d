"""``fedunlearn``: look after run directories, retained-update stores and datasets (no Flower needed).

    fedunlearn store info RUN_OR_STORE_DIR      rounds, clients, dtype, bytes per round, index table
    fedunlearn store verify RUN_OR_STORE_DIR    check the index and every blob, and of a run its
                                                identity, logs and model files (exit 1 if any is bad)
    fedunlearn certificates RUN_DIR_OR_LEDGER   the certified-removal ledger, one line per request
    fedunlearn data check NAME [--root DIR]     load a dataset and print its sizes
    fedunlearn data download NAME [--root DIR]  fetch a dataset into DIR, by default ~/data (the only
                                                command that downloads)
    fedunlearn config-docs [PATH] [--check]     write docs/configuration.md from the constraints table
    fedunlearn pyproject [PATH] [--check]       write the method keys of pyproject.toml's app config
    fedunlearn report RUN [--out FILE]          one self-contained HTML page of a run (tables, every
                                                figure, certificates, configuration)
    fedunlearn compare RUN RUN... [--out DIR]   several runs' unlearning comparisons side by side
                                                (with --out: compare.csv, .md and .png)

Training runs are launched with ``fedunlearn-run`` (or ``flwr run .``). ``store``,
``certificates`` and ``compare`` only read runs: they write, lock, clean up or migrate nothing in
them, and work on a read-only file system; ``report`` writes its one page, by default into the run.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

from fedunlearn import __version__
from fedunlearn.errors import ConfigError, FedUnlearnError, StoreCorruptionError

_UNCHECKSUMMED = (
    "note: this store's index is format 1: its rows (num_examples among them) carry no checksums "
    "yet; the first writable open (resuming the run, or UpdateStore(root)) adds them"
)
#: Where datasets go unless ``--root`` says otherwise (``digits`` needs none).
DEFAULT_DATA_ROOT = Path("~/data")
_LEDGER_FIELDS = (
    "request kind removed n_after beta_after budget retrained certified total_epsilon total_delta "
    "seconds loss mode bound lam sigma"
).split()


def _open_store(path: Path):
    """The store of a run directory or a store directory, opened read-only (writes nothing)."""
    for candidate in (path, path / "store"):
        if (candidate / "store.json").is_file():
            from fedunlearn.store.update_store import UpdateStore  # PyTorch: once there is a store

            return UpdateStore(candidate, readonly=True)
    raise ConfigError("path", str(path), "a run directory or a store directory holding store.json")


def _store_info(args: argparse.Namespace) -> int:
    store = _open_store(args.path)
    index = store.index()
    per_round = store.bytes_per_round()
    print(
        f"store {store.root}  dtype {store.dtype}  {len(store)} retained round(s)  {store.total_bytes():,} bytes"
    )
    if store.metadata:
        print("metadata: " + ", ".join(f"{k}={v}" for k, v in sorted(store.metadata.items())))
    if per_round:
        print(f"rounds: {store.rounds()}")
        print(f"clients: {store.clients()}")
        print(f"bytes per retained round: {int(sum(per_round.values()) / len(per_round)):,} (mean)")
    if args.index:
        print(index.to_markdown(index=False))
    if not store.rows_checksummed:
        print(_UNCHECKSUMMED)
    return 0


def _store_verify(args: argparse.Namespace) -> int:
    """Exit 0 when the store (and, for a run directory, every record of the run: its identity,
    logs and model files) is sound, 1 when problems were found (an index that cannot be opened is
    one), 2 when ``path`` holds no store."""
    if (args.path / "config.json").is_file() or (args.path / "identity.json").is_file():
        return _run_verify(args.path)
    try:
        store = _open_store(args.path)
    except StoreCorruptionError as error:
        print(error)
        print("0 blob(s) checked, 1 problem(s): the store cannot be opened")
        return 1
    store.close()
    from fedunlearn.store.run_check import store_problems

    checked = {"blobs": 0}
    problems = store_problems(store.root, checked)
    for problem in problems:
        print(problem)
    if not store.rows_checksummed:
        print(_UNCHECKSUMMED)
    print(f"{checked['blobs']} blob(s) checked, {len(problems)} problem(s)")
    return 1 if problems else 0


def _run_verify(path: Path) -> int:
    """``store verify`` of a run directory: every record a request reads."""
    from fedunlearn.store.run_check import run_problems

    problems, checked = run_problems(path)
    for problem in problems:
        print(problem)
    print(
        f"{checked['blobs']} blob(s) checked, {len(problems)} problem(s) ({checked['logs']} "
        f"log(s) and {checked['models']} model file(s) checked too)"
    )
    return 1 if problems else 0


def _read_ledger_for_display(path: Path) -> list[dict]:
    """The ledger's records; a torn last line is reported on stderr, the rest still shown."""
    from fedunlearn.certified.certificate import read_ledger
    from fedunlearn.store.durable_io import TornLineWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TornLineWarning)
        records = read_ledger(path)
    for warning in caught:
        if issubclass(warning.category, TornLineWarning):
            print(f"fedunlearn: warning: {warning.message}", file=sys.stderr)
        else:
            warnings.warn_explicit(
                warning.message, warning.category, warning.filename, warning.lineno
            )
    for number, record in enumerate(records, start=1):
        missing = [name for name in _LEDGER_FIELDS if name not in record]
        if missing:
            raise ConfigError(
                "path",
                str(path),
                f"a certified-removal ledger; its record {number} lacks {missing}",
            )
    return records


def _certificates(args: argparse.Namespace) -> int:
    import pandas as pd

    from fedunlearn.store.run_directory import CERTIFIED_LEDGER

    path = args.path / CERTIFIED_LEDGER if args.path.is_dir() else args.path
    if not path.is_file():
        raise ConfigError(
            "path",
            str(args.path),
            "a run directory holding certified_removal.jsonl, or a ledger file",
        )
    records = _read_ledger_for_display(path)
    table = pd.DataFrame(
        [
            {
                "request": r["request"],
                "kind": r["kind"],
                "removed": r["removed"],
                "n_after": r["n_after"],
                "beta_after": r["beta_after"],
                "budget": r["budget"],
                "retrained": r["retrained"],
                "certified": r["certified"],
                "epsilon": r["total_epsilon"],
                "delta": r["total_delta"],
                "seconds": r["seconds"],
            }
            for r in records
        ]
    )
    if not args.all and len(table) > 20:
        table = pd.concat([table.head(5), table.tail(15)])
    print(table.to_markdown(index=False, floatfmt=".4g"))
    if records:
        last = records[-1]
        print(
            f"{len(records)} certificate(s), {sum(r['retrained'] for r in records[1:])} retrain(s); "
            f"{last['loss']} loss, {last['mode']} mode, {last['bound']} bound, lambda {last['lam']:g}, "
            f"sigma {last['sigma']:g}; now beta {last['beta_after']:.4g} of {last['budget']:.4g}"
        )
    return 0


def _data(args: argparse.Namespace) -> int:
    from fedunlearn.data.datasets import load_dataset

    options = {"label_column": args.label_column, "test_fraction": args.test_fraction}
    splits = load_dataset(args.name, args.root, download=args.command == "download", **options)
    print(
        f"{splits.name}: {len(splits.train)} training and {len(splits.test)} test samples, "
        f"{splits.num_classes} classes, sample shape {tuple(splits.input_shape)}"
    )
    return 0


def _data_list(args: argparse.Namespace) -> int:
    """The registered datasets: what each holds, where ``data-root`` finds it, its default model."""
    from fedunlearn.dataset_registry import DATASETS

    for spec in DATASETS:
        classes = f"{spec.num_classes} classes" if spec.num_classes else "classes from the data"
        model = spec.default_model or "by sample shape"
        print(f"{spec.name}: {spec.description} ({classes}; model auto = {model})")
        print(
            f"    data-root holds {spec.layout}"
            + (f"; download: {spec.downloads}" if spec.downloads else "")
        )
    print('or your own loader: dataset = "module:function" (docs/adding-a-dataset.md)')
    return 0


def _models(args: argparse.Namespace) -> int:
    """The registered models (``model`` key), each with what it is and the samples it takes."""
    from fedunlearn.model_registry import MODELS

    ranks = {1: "feature vectors (F,)", 3: "images (C, H, W)"}
    for spec in MODELS:
        takes = ranks.get(spec.input_rank, "samples it is run on")
        print(f"{spec.name}: {spec.description}; takes {takes}")
    print('or your own builder: model = "module:function" (docs/adding-a-dataset.md)')
    return 0


def _config_docs(args: argparse.Namespace) -> int:
    """Write the configuration page; with ``--check``, exit 1 if the file differs instead."""
    from fedunlearn.config import constraints_markdown

    return _generated(args, constraints_markdown(), "config-docs", "the table's page")


def _pyproject(args: argparse.Namespace) -> int:
    """Rewrite the registered methods' keys in ``pyproject.toml``'s ``[tool.flwr.app.config]``
    (the block between its markers); with ``--check``, exit 1 if the block differs instead."""
    from fedunlearn.config.pyproject import with_method_keys

    if not args.path.is_file():
        raise ConfigError("path", str(args.path), "a pyproject.toml with the method-keys block")
    text = with_method_keys(args.path.read_text(encoding="utf-8"))
    return _generated(args, text, "pyproject", "the registry's method keys")


def _generated(args: argparse.Namespace, text: str, command: str, what: str) -> int:
    """Write ``text`` to ``args.path`` whole (or leave the old file untouched); with
    ``args.check``, write nothing and exit 1, naming ``fedunlearn <command>``, if it differs."""
    if args.check:
        current = args.path.read_text(encoding="utf-8") if args.path.is_file() else None
        if current != text:
            print(f"{args.path} does not hold {what}: run fedunlearn {command} {args.path}")
            return 1
        return 0
    if args.path.exists() and not args.path.is_file():
        raise ConfigError("path", str(args.path), f"a regular file to write {what} to")
    temporary = args.path.with_name(f".{args.path.name}.tmp")
    try:  # whole, or the old file untouched
        args.path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(text, encoding="utf-8")
        temporary.replace(args.path)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        raise ConfigError(
            "path", str(args.path), f"a file that can be written ({error.strerror})"
        ) from None
    print(f"wrote {args.path}")
    return 0


def _methods(args: argparse.Namespace) -> int:
    """The unlearning methods' table: what each keeps during training, the aggregations its math
    assumes, and whether the leaving client works during the request."""
    from fedunlearn.methods_table import methods_table

    print(methods_table().to_markdown(index=False))
    return 0


# ------------------------------------------------------------ report and compare
def _report(args: argparse.Namespace) -> int:
    """Write the run's HTML page (:mod:`fedunlearn.reporting.html_report`)."""
    from fedunlearn.reporting.html_report import write_report

    try:
        target = write_report(args.run, args.out)
    except OSError as error:
        raise ConfigError(
            "--out",
            str(args.out or args.run),
            f"a file that can be written ({error.strerror}); give --out FILE elsewhere",
        ) from None
    print(f"wrote {target} ({target.stat().st_size:,} bytes): open it in a browser")
    return 0


def _compare(args: argparse.Namespace) -> int:
    """Print the runs' comparisons side by side (:mod:`fedunlearn.reporting.compare`); with
    ``--out``, write compare.csv, compare.md and compare.png there too."""
    from fedunlearn.reporting.compare import compare_runs, to_console, write_comparison

    comparison = compare_runs(args.runs)
    print(to_console(comparison))
    if args.out is not None:
        for path in write_comparison(comparison, args.out):
            print(f"wrote {path}")
    return 0


def _add_report_commands(groups) -> None:
    """``fedunlearn report`` and ``fedunlearn compare``."""
    report = groups.add_parser("report", help="write one self-contained HTML page of a run")
    report.add_argument("run", type=Path, help="run directory")
    report.add_argument(
        "--out", type=Path, default=None, help="the page's file (default: RUN/report.html)"
    )
    report.set_defaults(handler=_report)
    compare = groups.add_parser("compare", help="several runs' unlearning comparisons side by side")
    compare.add_argument("runs", type=Path, nargs="+", metavar="RUN", help="run directories")
    compare.add_argument(
        "--out", type=Path, default=None, help="folder for compare.csv, compare.md and compare.png"
    )
    compare.set_defaults(handler=_compare)


# ------------------------------------------------------------ the parser
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedunlearn", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"fedunlearn {__version__}")
    groups = parser.add_subparsers(dest="group", required=True)
    store = groups.add_parser("store", help="inspect or verify a retained-update store")
    store_commands = store.add_subparsers(dest="command", required=True)
    info = store_commands.add_parser("info", help="summary of a store")
    info.add_argument("path", type=Path)
    info.add_argument("--index", action="store_true", help="print the whole index")
    info.set_defaults(handler=_store_info)
    verify = store_commands.add_parser("verify", help="verify every checksum")
    verify.add_argument("path", type=Path)
    verify.set_defaults(handler=_store_verify)
    ledger = groups.add_parser("certificates", help="show a certified-removal ledger")
    ledger.add_argument("path", type=Path, help="run directory or certified_removal.jsonl")
    ledger.add_argument("--all", action="store_true", help="every request, not the first/last 20")
    ledger.set_defaults(handler=_certificates)
    data = groups.add_parser("data", help="check or download a dataset")
    data_commands = data.add_subparsers(dest="command", required=True)
    for name, text in (
        ("check", "load a dataset from a root"),
        ("download", "fetch a dataset into a root"),
    ):
        command = data_commands.add_parser(name, help=text)
        command.add_argument("name", help="a dataset of `fedunlearn data list`, or module:function")
        command.add_argument(
            "--root",
            type=lambda text: Path(text).expanduser(),
            default=str(DEFAULT_DATA_ROOT),
            help="data root in torchvision's layout, or a data file (default: ~/data)",
        )
        command.add_argument("--label-column", default="label", help="a table's label column")
        command.add_argument(
            "--test-fraction",
            type=float,
            default=0.2,
            help="held out when the data has no test split",
        )
        command.set_defaults(handler=_data)
    listing = data_commands.add_parser("list", help="the registered datasets")
    listing.set_defaults(handler=_data_list)
    models = groups.add_parser("models", help="list the registered models")
    models.set_defaults(handler=_models)
    methods = groups.add_parser("methods", help="list the unlearning methods and what each needs")
    methods.set_defaults(handler=_methods)
    docs = groups.add_parser("config-docs", help="write the configuration page from the table")
    docs.add_argument("path", type=Path, nargs="?", default=Path("docs/configuration.md"))
    docs.add_argument("--check", action="store_true", help="exit 1 if PATH is out of date")
    docs.set_defaults(handler=_config_docs)
    keys = groups.add_parser("pyproject", help="write the method keys' block of pyproject.toml")
    keys.add_argument("path", type=Path, nargs="?", default=Path("pyproject.toml"))
    keys.add_argument("--check", action="store_true", help="exit 1 if PATH's block is out of date")
    keys.set_defaults(handler=_pyproject)
    _add_report_commands(groups)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # --help and --version end here, before any import
    from fedunlearn.store.durable_io import LogCorruptionError

    try:
        return args.handler(args)
    except (StoreCorruptionError, LogCorruptionError) as error:  # damaged or edited files: 1
        print(f"fedunlearn: error: {error}", file=sys.stderr)
        return 1
    except FedUnlearnError as error:
        print(f"fedunlearn: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
