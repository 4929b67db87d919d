"""The keys every run reads, each with its group, type, default, what it allows and what it
means, declared once as the fields of :class:`RunParameters`; and the groups.

A key that belongs to one method is declared on its registry entry instead (``MethodSpec.keys``,
:class:`fedunlearn.config.fields.MethodKey`); :mod:`fedunlearn.config.table` reads both as one
table. Keys are spelled as in ``[tool.flwr.app.config]`` of ``pyproject.toml`` (the attribute with
``-`` for ``_``). ``docs/configuration.md`` is generated from the table
(:func:`fedunlearn.config.constraints_markdown`). To add a key: one field here, in its group, and
its default in ``pyproject.toml``; a rule across keys goes in
:mod:`fedunlearn.config.training_rules` or :mod:`fedunlearn.config.request_rules` (by the phase it
checks) and in the order of :data:`fedunlearn.config.rules.RULES`.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedunlearn.config import choices
from fedunlearn.config.choices import (
    ADOPT_FEDERATION_SIZE,
    AGGREGATIONS,
    ATTACKS,
    CALIBRATION_ORDERS,
    DEVICES,
    MAX_ALPHA,
    MAX_CLIENTS,
    MAX_DERIVED_SEED,
    MAX_JUDGE_MODELS,
    MAX_REPLY_TIMEOUT,
    MAX_SEED,
    PARTITIONINGS,
    RETAIN_MODES,
    STORE_DTYPES,
)
from fedunlearn.config.constraints import (
    ByRule,
    Flag,
    FolderPath,
    Interval,
    NameList,
    NameOrImport,
    NeedsExtra,
    Options,
    PositiveNumbers,
    RunName,
    Text,
    TrackingUri,
)
from fedunlearn.config.fields import (
    AT_LEAST_1,
    NON_NEGATIVE,
    NUMBER,
    POSITIVE,
    WHOLE,
    key_in,
    lazy_names,
)

#: The groups, one per phase of a run, in the order the table and the page list them.
GROUPS = {
    "data": "Data: which samples each client holds, and the model that reads them",
    "training": "Training: federated averaging, the updates retained for unlearning, DP-SGD",
    "poisoning": "Poisoning: malicious clients poison training, and the unlearning request removes them "
    "(recovery from poisoning)",
    "federation": "Federation and run: the run directory, resuming, waiting for nodes and replies",
    "unlearning": "Unlearning: FedEraser, FedAccum and FedRetrain requests after training",
    "certified": "Certified head: certified removal on a linear head (Guo et al., 2020)",
    "scrubbing": (
        "Scrubbing: forgetting a cohort by Newton and Fisher scrubbing (Golatkar et al.) or, "
        "for a class, class-discriminative pruning (Wang et al.)"
    ),
    "audit": "Membership audit: offline LiRA against the unlearned models",
    "judge": "The judge: per-example forgetting tests over N independent federations",
}
#: Prefix a group's keys share; a key's name in the group view drops it (``config.certified.mode``).
_PREFIXES = {
    "poisoning": "attack_",
    "certified": "certified_",
    "scrubbing": "scrub_",
    "audit": "mia_",
    "judge": "judge_",
}


def _allowed_datasets() -> str:
    from fedunlearn.dataset_registry import DATASETS
    from fedunlearn.dataset_spec import allowed_datasets

    return allowed_datasets(DATASETS)


def _allowed_models() -> str:
    from fedunlearn.model_registry import MODELS
    from fedunlearn.model_spec import allowed_models

    return allowed_models(MODELS)


PARTITION_IDS = "comma-separated partition ids in [0, num-clients - 1], not all, e.g. '0' or '0,5'"

data, training, federation = key_in("data"), key_in("training"), key_in("federation")
# The group is not called "attack": that is one of its keys (``config.attack``).
poisoning = key_in("poisoning")
unlearning, certified, scrubbing, audit, judge = (
    key_in("unlearning"),
    key_in("certified"),
    key_in("scrubbing"),
    key_in("audit"),
    key_in("judge"),
)


@dataclass(frozen=True)
class RunParameters:
    """The keys every run reads, flat (``config.num_clients``), grouped by phase below; the
    registered methods' own keys are ``MethodSpec.keys``."""

    # ------------------------------------------------------------------ data
    dataset: str = data(
        "digits",
        NameOrImport(lambda: choices.DATASETS, _allowed_datasets),
        "the dataset (`fedunlearn data list`), or your loader as module:function; only digits is "
        "embedded",
    )
    data_root: str = data(
        "",
        FolderPath(required=False),
        "the data's folder (torchvision's layout), or file for a file format; not for digits",
    )
    download: bool = data(False, Flag(), "fetch a missing dataset into data-root")
    code_path: str = data(
        "",
        FolderPath(required=False),
        "a folder put first on the Python path of the ServerApp and every ClientApp, to import a "
        "dataset or model given as module:function",
    )
    label_column: str = data(
        "label",
        Text(),
        "the label's column of a table or Hugging Face dataset (dataset = table, hf-disk)",
    )
    test_fraction: float = data(
        0.2,
        Interval(NUMBER, 0.0, 1.0, closed="neither"),
        "the share held out for testing when the data has no test split (the file formats)",
    )
    model: str = data(
        "auto",
        NameOrImport(lambda: choices.MODELS, _allowed_models),
        "the network; auto picks the dataset's own; or your builder as module:function",
    )
    num_clients: int = data(
        ADOPT_FEDERATION_SIZE,
        Interval(WHOLE, 0, MAX_CLIENTS, note="0: the federation's size"),
        "K; 0: adopt the federation's number of SuperNodes (the server logs it); any other value "
        "must equal it",
    )
    train_samples: int = data(
        0, Interval(WHOLE, 0), "0: the whole training set; N: a seeded subset, then partitioned"
    )
    partitioning: str = data("iid", Options(PARTITIONINGS), "how samples are split over clients")
    alpha: float = data(
        0.5,
        Interval(NUMBER, 0, MAX_ALPHA, closed="right", note="for a uniform split: iid"),
        "Dirichlet concentration (partitioning = dirichlet)",
    )
    shards_per_client: int = data(2, AT_LEAST_1, "label shards per client (partitioning = shards)")
    seed: int = data(0, Interval(WHOLE, 0, MAX_SEED), "seeds the split, the model and training")
    # ------------------------------------------------------------------ training
    rounds: int = training(20, AT_LEAST_1, "global rounds of FedAvg")
    local_epochs: int = training(10, AT_LEAST_1, "E_loc, local epochs per round")
    lr: float = training(0.05, POSITIVE, "clients' SGD learning rate")
    momentum: float = training(0.9, Interval(NUMBER, 0.0, 1.0, closed="left"), "SGD momentum")
    weight_decay: float = training(0.0, NON_NEGATIVE, "SGD weight decay")
    batch_size: int = training(32, AT_LEAST_1, "local mini-batch size")
    fraction_evaluate: float = training(
        0.0, Interval(NUMBER, 0.0, 1.0), "fraction of clients evaluating the global model per round"
    )
    fraction_train: float = training(
        1.0,
        Interval(NUMBER, 0.0, 1.0, closed="right"),
        "fraction of the clients trained per round: max(int(K x fraction), min-train-clients), "
        "drawn by partition with the run's seed; below 1 only methods that hold under sampling run",
    )
    min_train_clients: int = training(
        2, AT_LEAST_1, "at least this many clients train per round when fraction-train < 1"
    )
    strategy: str = training(
        "fedavg",
        Options(AGGREGATIONS),
        "the Flower strategy aggregating each round (and each retraining); robust ones "
        "(fedmedian, fedtrimmedavg, krum) run only the methods that support them",
    )
    proximal_mu: float = training(0.01, NON_NEGATIVE, "FedProx's mu (strategy = fedprox)")
    trimmed_beta: float = training(
        0.2,
        Interval(NUMBER, 0.0, 0.5, closed="left"),
        "fraction trimmed from each tail (strategy = fedtrimmedavg)",
    )
    krum_malicious: int = training(
        0, Interval(WHOLE, 0), "Krum's f: malicious clients tolerated, K > 2f + 2 (strategy = krum)"
    )
    retain: bool = training(True, Flag(), "keep client updates for unlearning (FedEraser)")
    retain_interval: int = training(2, AT_LEAST_1, "Δt: retain at rounds 1, 1+Δt, 1+2Δt, ...")
    retain_mode: str = training(
        "full",
        Options(RETAIN_MODES),
        "full: whole updates at each retained round; norms: whole at t_1, then per-tensor norms",
    )
    store_dtype: str = training("float32", Options(STORE_DTYPES), "dtype of retained updates")
    device: str = training("auto", Options(DEVICES), "where clients train; auto: cuda if present")
    model_seed: int = training(
        -1,
        Interval(WHOLE, -1, MAX_DERIVED_SEED, note="a judge run's members use derived seeds"),
        "seeds the initial model and the batch order; -1: seed (the split stays seed's)",
    )
    stack_models: int = training(
        0,
        Interval(WHOLE, 0, MAX_JUDGE_MODELS, note="0: off; else at least 2"),
        "N federations trained as one stack (seed's split; member i's model-seed: stack.json), "
        "every method's comparison per member",
    )
    dp_noise_multiplier: float = training(0.0, NON_NEGATIVE, "DP-SGD noise multiplier; 0: no DP")
    dp_clipping_norm: float = training(1.0, POSITIVE, "DP-SGD per-sample clipping norm")
    dp_delta: float = training(
        1e-5, Interval(NUMBER, 0.0, 1.0, closed="left"), "delta of the clients' DP guarantee"
    )
    # ------------------------------------------------------------------ poisoning
    attack_clients: str = poisoning(
        "",
        ByRule(PARTITION_IDS),
        "malicious clients during training (empty: none); unlearn-clients names them or is empty",
    )
    attack: str = poisoning(
        "none",
        Options(ATTACKS),
        "backdoor / label-flip (every label y to C-1-y) poison their data; scaled-update boosts "
        "their updates",
        name="kind",
    )
    attack_scale: float = poisoning(
        10.0,
        POSITIVE,
        "lambda of scaled-update: the reply is M + lambda (M_k - M) (FLTrust's lambda = n)",
    )
    attack_target_class: int = poisoning(
        0, Interval(WHOLE, 0), "backdoor: the class triggered samples are relabelled to"
    )
    attack_fraction: float = poisoning(
        0.5,
        Interval(NUMBER, 0.0, 1.0, closed="right"),
        "backdoor: share of a malicious client's samples triggered (drawn from other classes)",
    )
    # ------------------------------------------------------------------ federation and run
    output_dir: str = federation(
        "~/fedunlearn-runs",
        FolderPath(required=True, example="~/fedunlearn-runs"),
        "parent folder of run directories (absolute or ~)",
    )
    run_name: str = federation("", RunName(), "run directory name; empty: <dataset>-<timestamp>")
    resume: bool = federation(
        False, Flag(), "continue output-dir/run-name from its last completed round (after a crash)"
    )
    log_tensorboard: bool = federation(
        False,
        NeedsExtra(Flag(), "tensorboard"),
        "also write each round's metrics and each request's comparison as TensorBoard event "
        "files under RUN/tensorboard/",
    )
    log_mlflow: str = federation(
        "",
        NeedsExtra(TrackingUri(), "mlflow"),
        "also log the run config, each round's metrics and each request's comparison to an "
        "MLflow run (one per run directory); run: an SQLite store RUN/mlflow.db",
    )
    node_wait_seconds: float = federation(
        120.0,
        POSITIVE,
        "seconds to wait for SuperNodes: K at the start, min-reply-fraction of a round's clients",
    )
    reply_timeout: float = federation(
        3600.0,
        Interval(NUMBER, 0, MAX_REPLY_TIMEOUT, closed="right"),
        "seconds the server waits for the replies to one request (an unlearning request: for "
        "offline remaining clients first)",
    )
    max_refusals: int = federation(
        3, AT_LEAST_1, "a node refused this many rounds in a row is dropped from the run"
    )
    min_reply_fraction: float = federation(
        0.5,
        Interval(NUMBER, 0.0, 1.0, closed="right"),
        "a round needs valid replies from at least this fraction of the clients asked",
    )
    max_update_ratio: float = federation(
        100.0,
        Interval(NUMBER, 1.0, 1e12, off=0.0),
        "a training reply whose update's norm is over this many times the median of the round's "
        "other updates is refused; 0: no such bound, and a FedAvg round then folds each reply "
        "into its sum as it arrives (docs/scale.md)",
    )
    # ------------------------------------------------------------------ unlearning
    unlearn_clients: str = unlearning(
        "0", ByRule(PARTITION_IDS), "clients to forget; empty: train only"
    )
    unlearn_methods: str = unlearning(
        ",".join(choices.DEFAULT_UNLEARNING_METHODS),
        NameList(lambda: choices.UNLEARNING_METHODS, required=True),
        "the unlearning methods, compared side by side",
    )
    allow_target_participation: bool = unlearning(
        False,
        Flag(),
        "let methods whose leaving client works during the request run (pga, fedosd, fedquit); "
        "it still receives nothing after the request",
    )
    calibration_ratio: float = unlearning(
        0.5,
        Interval(NUMBER, 0.0, 1.0, closed="right"),
        "r: E_cali = ceil(r E_loc) calibration epochs (FedEraser)",
    )
    calibration_layerwise: bool = unlearning(
        True, Flag(), "eq. 2 norms per tensor (true) or over the whole vector (false)"
    )
    calibration_order: str = unlearning(
        "client",
        Options(CALIBRATION_ORDERS),
        "client: eq. 2 per client, then aggregate; average: the paper's code",
    )
    calibration_clients: int = unlearning(
        0,
        Interval(WHOLE, 0),
        "FedEraser under client sampling (ours): each calibrated retained round with fewer remaining "
        "participants is topped up to this many with remaining clients drawn by the run's seed, "
        "each stepping by the participants' mean norm; 0: its participants only (the paper's "
        "rule read as it is); no effect when every client trains every round (docs/scale.md)",
    )
    unlearn_only: bool = unlearning(
        False, Flag(), "reopen the trained run output-dir/run-name and forget more clients"
    )
    unlearn_adopt: str = unlearning(
        "auto",
        Options(lambda: ("auto", *choices.ADOPTABLE_METHODS)),
        "whose trajectory becomes the retained history; auto: federaser when unflagged and within "
        "adopt-tolerance of fedretrain, else fedretrain",
    )
    adopt_tolerance: float = unlearning(
        1.0,
        Interval(NUMBER, 0.0, 100.0),
        "auto adopts FedEraser only within this many points of FedRetrain's test accuracy, "
        "else FedRetrain (the reason is logged)",
    )
    flag_gap: float = unlearning(
        5.0,
        Interval(NUMBER, 0.0, 100.0),
        "a method this many points of test accuracy below FedRetrain (without it: the "
        "original) is flagged; when the request forgets a client that planted a backdoor (the "
        "forgetting signal), so is one whose backdoor success is this many points above "
        "FedRetrain's (kept the attack, or forgot nothing when within this many of the "
        "original's), and every method where the signal cannot measure (forgetting not "
        "measurable); without a signal, one that stayed by the original (forgot nothing)",
    )
    post_training_rounds: int = unlearning(
        2,
        Interval(WHOLE, 0),
        "PGA, FedQUIT, FedOSD: rounds of the run's aggregation by the remaining clients after "
        "the unlearning step (ours for FedQUIT, whose code stops at a retrained model's accuracy)",
    )
    keep_original: bool = unlearning(
        False, Flag(), "keep the pre-request model and history under original-<request>/"
    )
    # ------------------------------------------------------------------ certified head
    certified_head: bool = certified(
        False,
        Flag(),
        "train a certified head on the body's features and remove samples",
        name="enabled",
    )
    certified_loss: str = certified(
        "logistic",
        Options(lazy_names("fedunlearn.certified.losses", "LOSSES")),
        "logistic (one-vs-rest) or least-squares (exact removal)",
        name="loss",
    )
    certified_lambda: float = certified(
        1e-3,
        Interval(NUMBER, 0, closed="neither", note="the regulariser makes L strongly convex"),
        "lambda of (lambda n / 2) ||w||^2",
        name="lam",
    )
    certified_sigma: float = certified(
        1.0,
        ByRule("a number > 0 (the perturbation's scale), unless certified-noise = none"),
        "std of the perturbation b (gaussian) or its norm's scale (gamma)",
    )
    certified_epsilon: float = certified(1.0, POSITIVE, "epsilon of (epsilon, delta)-removal")
    certified_delta: float = certified(
        1e-4,
        Interval(NUMBER, 0.0, 1.0, closed="neither"),
        "delta of (epsilon, delta)-removal (Guo et al. Theorem 3 divides by it)",
    )
    certified_noise: str = certified(
        "gaussian",
        Options(lazy_names("fedunlearn.certified.perturbation", "NOISES")),
        "gaussian: (epsilon, delta)-CR; gamma: epsilon-CR; none: least squares only",
    )
    certified_mode: str = certified(
        "fast",
        Options(lazy_names("fedunlearn.certified.certificate", "MODES")),
        "exact: Hessian at the current w per request; fast: cached factor",
    )
    certified_bound: str = certified(
        "per-point",
        Options(lazy_names("fedunlearn.certified.certificate", "BOUNDS")),
        "per-point (tighter), corollary (Guo et al. Corollary 1) or cached (fast mode: Corollary 1 "
        "from cached statistics, no read of X per request)",
    )
    certified_gamma: str = certified(
        "exact",
        Options(lazy_names("fedunlearn.certified.certificate", "GAMMAS")),
        "Lipschitz constant of the logistic l'': exact 1/(6 sqrt 3) or paper 1/4",
    )
    certified_refresh_ratio: float = certified(
        5.0, POSITIVE, "fast mode: refresh the cached Hessian when ||w - w0|| > ratio ||step||"
    )
    certified_removals: int = certified(
        100, Interval(WHOLE, 0), "single-sample removal requests, drawn at random across clients"
    )
    certified_remove_clients: str = certified(
        "", ByRule(PARTITION_IDS), "then remove these clients' whole data"
    )
    certified_eval_every: int = certified(
        10, AT_LEAST_1, "test accuracy and beta recorded every this many requests"
    )
    certified_verify_central: bool = certified(
        True, Flag(), "simulation: also fit the head centrally and report the difference"
    )
    # ------------------------------------------------------------------ scrubbing
    scrub: bool = scrubbing(
        False, Flag(), "scrub scrub-forget and compare every scrub-methods entry", name="enabled"
    )
    scrub_forget: str = scrubbing(
        "",
        ByRule("a cohort when scrub = true: class:C, client:K, samples:K:N or samples:K:N:C"),
        "the cohort D_f to forget",
    )
    scrub_methods: str = scrubbing(
        ",".join(choices.SCRUB_METHODS),
        NameList(lambda: choices.SCRUB_METHODS, required=False),
        "scrubbing methods and baselines; original and retrain always run",
    )
    scrub_newton_lambda: float = scrubbing(1e-6, POSITIVE, "lambda of eq. 7's noise on the head")
    scrub_fisher_lambda: float = scrubbing(1e-7, POSITIVE, "lambda of Fisher forgetting")
    scrub_fisher_sqrt_lambda: float = scrubbing(1e-11, POSITIVE, "lambda of the F^-1/2 variant")
    scrub_fisher_reference_lambda: float = scrubbing(
        1e-12, POSITIVE, "lambda of the authors' released recipe (alpha = sqrt(lambda) sigma_h)"
    )
    scrub_sigma_h: float = scrubbing(1.0, POSITIVE, "sigma_h")
    scrub_lambda_factors: str = scrubbing(
        "0.01,0.1,1,10,100", PositiveNumbers(), "lambda grid (x each method's lambda)"
    )
    scrub_damping: float = scrubbing(1e-3, NON_NEGATIVE, "mu added to the head's Hessian B")
    scrub_fisher_floor: float = scrubbing(1e-3, NON_NEGATIVE, "F is floored here")
    scrub_fisher_samples: int = scrubbing(
        1000, AT_LEAST_1, "samples per client and part for the diagonal Fisher"
    )
    scrub_time: float = scrubbing(
        0.0, NON_NEGATIVE, "eta t of eq. 6 (newton-finite); 0: lr x local SGD steps in training"
    )
    scrub_baseline_rounds: int = scrubbing(
        2, AT_LEAST_1, "federated rounds of finetune, negative-gradient and random-labels"
    )
    scrub_baseline_epochs: int = scrubbing(1, AT_LEAST_1, "local epochs in those rounds")
    prune_layer: str = scrubbing(
        "features",
        Options(lazy_names("fedunlearn.scrubbing.pruning", "LAYERS")),
        "class-pruning: the body's feature units, or its last convolution's channels",
    )
    prune_ratio: float = scrubbing(
        0.3,
        Interval(NUMBER, 0, 1, closed="neither"),
        "class-pruning: R, the fraction of the layer's channels pruned (at least one)",
    )
    prune_finetune_rounds: int = scrubbing(
        2, Interval(WHOLE, 0), "class-pruning: FedAvg rounds on D_r after pruning; 0: prune only"
    )
    prune_finetune_epochs: int = scrubbing(1, AT_LEAST_1, "local epochs in those rounds")
    scrub_relearn_threshold: float = scrubbing(
        0.3, POSITIVE, "relearn time: training on D until the D_f loss is below this"
    )
    scrub_relearn_epochs: float = scrubbing(1.0, POSITIVE, "relearn budget in epochs of D")
    # ------------------------------------------------------------------ membership audit
    mia: bool = audit(
        False, Flag(), "audit every method with LiRA (one unlearn-clients target)", name="enabled"
    )
    mia_reference_models: int = audit(
        2, Interval(WHOLE, 2), "models trained without the target, for offline LiRA"
    )
    # ------------------------------------------------------------------ judge
    judge_models: int = judge(
        0,
        Interval(WHOLE, 0, MAX_JUDGE_MODELS, note="0: off; else at least 3"),
        "N: independent federations trained as one stack, each unlearned by every method",
    )
    judge_backdoor: bool = judge(
        False, Flag(), "plant a trigger in the target client's samples (backdoor verification)"
    )
    judge_backdoor_fraction: float = judge(
        0.5,
        Interval(NUMBER, 0.0, 1.0, closed="right"),
        "fraction of the target's samples that carry the trigger (drawn from other classes)",
    )
    judge_backdoor_class: int = judge(
        0, Interval(WHOLE, 0), "the class a triggered sample is relabelled to"
    )
    judge_metrics: str = judge(
        ",".join(choices.JUDGE_METRICS),
        NameList(lambda: choices.JUDGE_METRICS, required=True),
        "the judge's tests (registered metrics), each a group of columns of judge.csv",
    )
