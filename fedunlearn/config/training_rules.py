"""The rules across keys that check what a run trains on and how: the data and the model that fits
it, the history retained for the unlearning methods (``retain``, ``retain-mode``), the aggregation
and the client sampling every method of the run must hold under; with the helpers the request
rules (:mod:`fedunlearn.config.request_rules`) share. They run in the order of
:data:`fedunlearn.config.rules.RULES`.
"""

from __future__ import annotations

import functools

from fedunlearn.config import choices
from fedunlearn.config.choices import ADOPT_FEDERATION_SIZE
from fedunlearn.config.parameters import RunParameters
from fedunlearn.errors import ConfigError
from fedunlearn.registry import UNLEARNING, norms_problem


def size_known(config: RunParameters) -> bool:
    """Whether ``num-clients`` is known: a rule comparing against it waits for the federation's
    size when it is to be adopted (:meth:`fedunlearn.config.ExperimentConfig.with_federation_size` checks again)."""
    return config.num_clients != ADOPT_FEDERATION_SIZE


@functools.lru_cache(maxsize=64)
def model_problem(model: str, sample_shape: tuple[int, ...], num_classes: int = 2) -> str:
    """Why ``model`` cannot classify samples of ``sample_shape`` ("" when it can): it does not
    build, does not take them, gives other than ``num_classes`` outputs, or (a user's model
    split at its linear head) its output is not ``head(body(x))``."""
    import torch

    from fedunlearn.training.models import build_model

    # On the CPU, one sample, the caller's random state untouched: PyTorch's meta device would
    # spare the weights but imports TorchDynamo for its first operation (over a second at start).
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            net = build_model(model, sample_shape, num_classes)
            net.eval()
            sample = torch.randn((2, *sample_shape))
            logits = net(sample)
            features = net.features(sample)
    except (ConfigError, RuntimeError, ValueError, TypeError) as error:
        reason = error.allowed if isinstance(error, ConfigError) else str(error).split("\n")[0]
        return reason[:400]
    if tuple(logits.shape) != (2, num_classes):
        return f"it gives outputs of shape {tuple(logits.shape[1:])}, not ({num_classes},)"
    if features.dim() != 2 or not torch.allclose(net.head(features), logits, atol=1e-5):
        return "its output is not head(body(x)): the linear head must be its last step"
    return ""


# ------------------------------------------------------------------ data and training
def check_user_code(config: RunParameters) -> None:
    """A user's own loader (``dataset``) or builder (``model``), given as ``module:function`` or
    named by an installed package's entry point, imports and takes the arguments it is called
    with (one line naming the key otherwise); with ``code-path``, from that folder first. Every
    party validates its config before it loads data or builds a model, so this also puts the
    folder on each process's path in time."""
    from fedunlearn.dataset_registry import DATASETS
    from fedunlearn.dataset_spec import check_loader, on_python_path
    from fedunlearn.model_registry import MODELS
    from fedunlearn.model_spec import AUTO, check_builder

    loader = DATASETS.user_code(config.dataset)
    builder = MODELS.user_code(config.model) if config.model != AUTO else None
    if not (loader or builder):
        return
    # A folder missing here is no error where the module imports anyway (a SuperNode of a
    # deployment that installed it): code-path is a path on each machine.
    here = bool(config.code_path) and config.code_path_folder.is_dir()
    if here:
        on_python_path(config.code_path)
    try:
        if loader:
            check_loader(loader, config.dataset)
        if builder:
            check_builder(builder, config.model)
    except ConfigError:
        if config.code_path and not here:
            allowed = "an existing folder holding your module(s) on this machine"
            raise ConfigError("code-path", config.code_path, allowed) from None
        raise


def check_optional_packages(config: RunParameters) -> None:
    """A choice that needs an optional extra (Flower Datasets' partitioners, a Hugging Face
    folder) is refused at launch, naming the install, when the package is missing."""
    import importlib.util

    needs = (
        (
            "partitioning",
            config.partitioning.startswith("flower-"),
            "flwr_datasets",
            "flower-datasets",
        ),
        ("dataset", config.dataset == "hf-disk", "datasets", "hf"),
    )
    for key, used, module, extra in needs:
        if used and importlib.util.find_spec(module) is None:
            value = getattr(config, key)
            raise ConfigError(
                key, value, f"{value} with its package installed: pip install 'fedunlearn[{extra}]'"
            )


def check_model_fits_dataset(config: RunParameters) -> None:
    """The model's layers take the dataset's samples (e.g. not mnist-cnn's two 5x5 convolutions on
    8x8 digits), found by running it on one CPU sample: no data needed when the dataset states
    its sample shape; otherwise the launcher's preflight checks once the data is loaded."""
    from fedunlearn.config.choices import MODELS, NUM_CLASSES, SAMPLE_SHAPES

    model, dataset = config.model, config.dataset
    if model == "auto" or dataset not in SAMPLE_SHAPES:
        return
    shape, classes = SAMPLE_SHAPES[dataset], NUM_CLASSES.get(dataset, 2)
    problem = model_problem(model, shape, classes)
    if problem:
        fitting = [m for m in MODELS[1:] if not model_problem(m, shape, classes)]
        raise ConfigError(
            "model",
            model,
            f"auto or a model that fits {dataset} samples of shape {shape}: "
            f"{', '.join(fitting)} ({model}: {problem})",
        )


def check_train_samples_cover_clients(config: RunParameters) -> None:
    """A subset of the training set holds at least one sample per client."""
    if 0 < config.train_samples < config.num_clients:
        raise ConfigError(
            "train-samples",
            config.train_samples,
            f"0 (the whole training set) or at least num-clients={config.num_clients}",
        )


def check_data_root(config: RunParameters) -> None:
    """A data root exists unless the dataset is to be downloaded into it, and every registered
    dataset but the embedded digits has one (a file, for the file formats)."""
    from fedunlearn.dataset_registry import DATASETS

    spec = DATASETS.spec(config.dataset)
    path = config.data_root_path
    exists = path.is_dir() or (spec.root_is_file and path.is_file())
    if config.data_root and not config.download and not exists:
        what = "an existing file or folder" if spec.root_is_file else "an existing directory"
        fetch = (
            f": fetch the data with `fedunlearn data download {config.dataset} --root "
            f"{config.data_root}` or --set download=true"
            if spec.downloads
            else ""
        )
        raise ConfigError("data-root", config.data_root, f"{what}; {path} does not exist{fetch}")
    if spec.needs_root and config.dataset in DATASETS and not config.data_root:
        raise ConfigError(
            "data-root",
            config.data_root,
            f"dataset {config.dataset!r} needs a data root holding {spec.layout}; only 'digits' "
            "is embedded",
        )


def check_dp_delta(config: RunParameters) -> None:
    """DP-SGD with noise has a delta > 0."""
    if config.dp_noise_multiplier > 0 and config.dp_delta == 0:
        raise ConfigError(
            "dp-delta", config.dp_delta, "a number in (0, 1) when dp-noise-multiplier > 0"
        )


# -------------------------------------------------------------- retention, aggregation, sampling
def check_retention_for_methods(config: RunParameters) -> None:
    """Methods that read the history retained during training have it (``retain = true``)."""
    rebuilding = [m for m in choices.RETAINED_UPDATE_METHODS if m in config.methods]
    if config.unlearn_targets and not config.retain and rebuilding:
        raise ConfigError(
            "retain",
            config.retain,
            f"true: {', '.join(rebuilding)} rebuild the model from the history retained during "
            "training (or set unlearn-methods='fedretrain')",
        )


def check_retain_mode(config: RunParameters) -> None:
    """``retain-mode = norms`` keeps whole updates of round t_1 only: every method of the run reads
    no more (FedEraser with per-client calibration), or is refused before anything is trained."""
    if config.retain_mode != "norms" or not config.retain:
        return
    problems = [norms_problem(UNLEARNING[name]) for name in config.methods]
    problems = [problem for problem in problems if problem]
    if problems:
        keep = [name for name in config.methods if not norms_problem(UNLEARNING[name])]
        raise ConfigError(
            "retain-mode",
            config.retain_mode,
            f"'full' for these methods ({'; '.join(problems)}), or unlearn-methods without "
            f"them (e.g. '{','.join(keep) or 'federaser'}')",
        )
    if config.calibration_order == "average" and "federaser" in config.methods:
        raise ConfigError(
            "calibration-order",
            config.calibration_order,
            "'client' when retain-mode = norms: the paper code's average calibration needs the "
            "whole updates of every retained round",
        )


def check_calibration_clients(config: RunParameters) -> None:
    """``calibration-clients`` tops up eq. 2's per-client calibration: the paper code's average
    calibration (``calibration-order = average``) has no per-client step to borrow."""
    if config.calibration_clients > 0 and config.calibration_order == "average":
        raise ConfigError(
            "calibration-clients",
            config.calibration_clients,
            "0 with calibration-order = average (the top-up calibrates each client's update)",
        )


def method_specs(config: RunParameters) -> list:
    """The registry entries of the run's unlearning methods (a name the choices list but no entry
    holds is the constraint's to report)."""
    return [UNLEARNING[name] for name in config.methods if name in UNLEARNING]


def check_aggregation(config: RunParameters) -> None:
    """Every unlearning method of the run supports its ``strategy``
    (:meth:`fedunlearn.registry.MethodSpec.aggregation_problem`); Krum has K > 2f + 2; FedProx's
    proximal term is not in a judge run's stacked training."""
    problems = [spec.aggregation_problem(config.strategy) for spec in method_specs(config)]
    problems = [problem for problem in problems if problem]
    if problems:
        keep = [s.name for s in method_specs(config) if not s.aggregation_problem(config.strategy)]
        raise ConfigError(
            "strategy",
            config.strategy,
            f"an aggregation every unlearning method supports ({'; '.join(problems)}), or "
            f"unlearn-methods without them (e.g. '{','.join(keep) or 'fedretrain'}')",
        )
    if config.strategy == "krum" and size_known(config):
        if config.num_clients <= 2 * config.krum_malicious + 2:
            raise ConfigError(
                "krum-malicious",
                config.krum_malicious,
                f"f with num-clients > 2f + 2 (Krum's condition; num-clients = {config.num_clients})",
            )
    if config.strategy == "fedprox" and (config.judge_models or config.stack_models):
        key = "judge-models" if config.judge_models else "stack-models"
        raise ConfigError(
            "strategy", config.strategy, f"fedavg with {key} (a stack has no proximal term)"
        )


def check_sampling(config: RunParameters) -> None:
    """With ``fraction-train`` < 1 every unlearning method holds under sampling
    (:meth:`fedunlearn.registry.MethodSpec.sampling_problem`), neither DP-FedAvg's accountant nor a
    judge run's stacked federations (both assume every client in every round) is on, and
    ``min-train-clients`` does not exceed the federation."""
    fraction = config.fraction_train
    if fraction >= 1:
        return
    problems = [p for spec in method_specs(config) if (p := spec.sampling_problem(fraction))]
    if problems:
        keep = [s.name for s in method_specs(config) if not s.sampling_problem(fraction)]
        raise ConfigError(
            "fraction-train",
            fraction,
            f"1.0 for methods that need every client in every round ({'; '.join(problems)}), or "
            f"unlearn-methods without them (e.g. '{','.join(keep) or 'fedretrain'}')",
        )
    for on, what in (
        (config.dp_noise_multiplier > 0, "DP-FedAvg (dp-noise-multiplier > 0), whose accountant"),
        (bool(config.judge_models), "a judge run (judge-models), whose stacked federations"),
        (bool(config.stack_models), "stack-models, whose stacked federations"),
    ):
        if on:
            raise ConfigError(
                "fraction-train", fraction, f"1.0 with {what} assume every client in every round"
            )
    if size_known(config) and config.min_train_clients > config.num_clients:
        raise ConfigError(
            "min-train-clients",
            config.min_train_clients,
            f"at most num-clients ({config.num_clients}) when fraction-train < 1",
        )
    if config.strategy == "krum" and size_known(config):
        from fedunlearn.training.sampling import sample_size

        remaining = config.num_clients - len(config.unlearn_targets)  # FedRetrain's pool
        n = sample_size(remaining, fraction, config.min_train_clients)
        if n <= 2 * config.krum_malicious + 2:
            raise ConfigError(
                "fraction-train",
                fraction,
                f"a fraction whose rounds keep Krum's condition n > 2f + 2 (krum-malicious = "
                f"{config.krum_malicious}; a retraining round would train {n} clients)",
            )
