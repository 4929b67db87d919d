"""The names and limits the run configuration's keys choose from.

The method lists below are read through this module when a value is checked (the constraints
table in :mod:`fedunlearn.config.parameters` holds callables; the rules read ``choices.X``), so they
may be derived from elsewhere, e.g. method registries, without touching the table.
"""

from __future__ import annotations

from fedunlearn.config.constraints import INT64
from fedunlearn.dataset_registry import DATASETS as _DATASET_REGISTRY
from fedunlearn.model_registry import MODELS as _MODEL_REGISTRY
from fedunlearn.model_spec import AUTO
from fedunlearn.registry import AGGREGATIONS, SCRUBBING, UNLEARNING
from fedunlearn.registry import JUDGE_METRICS as _JUDGE_REGISTRY
from fedunlearn.store.retention import RETAIN_MODES

#: Ours, then Flower Datasets' partitioners over the same labels (``flower-*``: the split other
#: Flower baselines get for the same seed; :mod:`fedunlearn.data.flower_partitioners`).
PARTITIONINGS = ("iid", "dirichlet", "shards", "flower-iid", "flower-dirichlet", "flower-shards")
STORE_DTYPES = ("float32", "float16")
RETAIN_MODES = RETAIN_MODES  # full | norms (fedunlearn.store.retention)
DEVICES = ("auto", "cpu", "cuda")
CALIBRATION_ORDERS = ("client", "average")
AGGREGATIONS = AGGREGATIONS  # the Flower strategies of ``strategy`` (fedunlearn.registry)
#: What the malicious clients of a poisoning run do (``attack``): plant a backdoor or flip labels in
#: their data (data poisoning), or boost their updates (model poisoning); "none": no attack.
ATTACKS = ("none", "backdoor", "label-flip", "scaled-update")
#: The judge trains at most this many federations at once (each message carries all of them).
MAX_JUDGE_MODELS = 256

# ------------------------------------------------------------------ method, dataset, model names
# The method lists come from the registries (fedunlearn.registry) and are read on every access
# (the module ``__getattr__`` below), so a method registered later is listed, validated and run
# like a built-in one.
_METHOD_LISTS = {
    "UNLEARNING_METHODS": lambda: UNLEARNING.names(),
    #: The methods ``unlearn-methods`` runs by default (FedEraser, FedAccum, FedRetrain).
    "DEFAULT_UNLEARNING_METHODS": lambda: UNLEARNING.names(default=True),
    #: Methods whose trajectory can become the retained history after a request (unlearn-adopt).
    "ADOPTABLE_METHODS": lambda: UNLEARNING.names(adoptable=True),
    #: Methods that read a retained history (a retention policy: they need ``retain = true``).
    "RETAINED_UPDATE_METHODS": lambda: tuple(
        spec.name for spec in UNLEARNING if spec.retention is not None
    ),
    #: Scrubbing methods (Golatkar et al.) and baselines; "original" and "retrain" always run.
    "SCRUB_METHODS": lambda: SCRUBBING.names(),
    #: The judge's tests (forgetting score, U-LiRA, RMIA, ...), each a group of judge.csv columns.
    "JUDGE_METRICS": lambda: _JUDGE_REGISTRY.names(),
    # The datasets and models come from their registries (fedunlearn.dataset_registry,
    # fedunlearn.model_registry); a user's own is named as "module:function" instead.
    "DATASETS": lambda: _DATASET_REGISTRY.names(),
    "MODELS": lambda: (AUTO, *_MODEL_REGISTRY.names()),
    #: Classes of each dataset that states them (the backdoor's target class is one of them).
    "NUM_CLASSES": lambda: {s.name: s.num_classes for s in _DATASET_REGISTRY if s.num_classes},
    #: The input shape of one sample of each dataset that states it, to check a model fits before
    #: any data is loaded; the others are checked once loaded (the launcher's preflight).
    "SAMPLE_SHAPES": lambda: {
        s.name: s.sample_shape for s in _DATASET_REGISTRY if s.sample_shape is not None
    },
}
METHOD_LISTS = tuple(_METHOD_LISTS)


def __getattr__(name: str):
    if name in _METHOD_LISTS:
        return _METHOD_LISTS[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ------------------------------------------------------------------ limits
#: Largest federation a run may ask for: the simulation launches one SuperNode per client before
#: any of them is checked, and the server asks every one of them to describe itself once. Measured
#: up to 100,000 on 2 cores (docs/scale.md); the time per node and the memory per node, not a
#: structure of the rounds, are what stop larger ones.
MAX_CLIENTS = 1_000_000
#: ``num-clients`` = 0: not set; the ServerApp adopts the federation's number of SuperNodes (each
#: node's ``num-partitions``) before anything is written, and every later step sees that number.
ADOPT_FEDERATION_SIZE = 0
#: Seeds feed scikit-learn's and NumPy's generators, which take unsigned 32-bit seeds.
MAX_SEED = 2**32 - 1
#: The largest seed :func:`fedunlearn.seeding.derive_seed` gives (63 bits).
MAX_DERIVED_SEED = 2**63 - 1
#: Beyond this the Dirichlet split is iid in all but name (and its draws overflow near 1e308).
MAX_ALPHA = 1e6
#: Longest wait for one request's replies: a day; a longer one would hide a dead federation.
MAX_REPLY_TIMEOUT = 86_400
INT64 = INT64  # Flower's run config holds 64-bit integers (fedunlearn.config.constraints)
