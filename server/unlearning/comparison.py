"""The comparison table of an unlearning request: every method's model measured (test and target
accuracy, the backdoor's success, distances to the original and to FedRetrain, each remaining
client's accuracy), its costs (client-epochs, traffic, retained history), keep-training read at
each method's cost, and the verdicts: what it did, whether it forgot, its flag
(:mod:`fedunlearn.unlearning.verdicts`).

The readouts need the targets' and the clients' training data. In a simulation the server rebuilds
those partitions from the run configuration for measurement only; no method ever reads them.
"""

from __future__ import annotations

import math

import pandas as pd
import torch

from fedunlearn.data.poisoning import poisoning_success_rate
from fedunlearn.registry import UNLEARNING
from fedunlearn.store.history import history, load_policy
from fedunlearn.training.local import evaluate, resolve_device
from fedunlearn.training.model_state import State
from fedunlearn.unlearning.keep_training import at_client_epochs
from fedunlearn.unlearning.metrics import (
    angle_degrees,
    class_accuracies,
    client_accuracy,
    l2_distance,
    per_neuron_angles,
    prediction_difference,
)
from fedunlearn.unlearning.verdicts import flag_rows, forgetting_labels
from server.method_runner import MethodRunner, diverged_methods
from server.training.rounds import TrainingOutcome

KEEP_TRAINING = "keep-training"


def measure(
    outcome: TrainingOutcome,
    models: dict[str, State],
    seconds: dict[str, float],
    targets: list[int],
    excluded: list[int] | None = None,
) -> tuple[pd.DataFrame, dict[str, list[float]], pd.DataFrame]:
    """The comparison table (one row per method), the per-neuron angles to FedRetrain and each
    remaining client's accuracy under each model (:func:`client_accuracies`); ``excluded``: every
    client forgotten so far (default ``targets``), left out of the remaining clients."""
    device = resolve_device(outcome.config.device)
    splits = outcome.data.splits
    target_x = torch.cat([outcome.data.client_split(t).x for t in targets])
    target_y = torch.cat([outcome.data.client_split(t).y for t in targets])
    original = outcome.new_model().to(device)
    original.load_state_dict(outcome.final_state)
    retrained = models.get("fedretrain")
    remaining = [k for k in range(outcome.data.num_clients) if k not in set(excluded or targets)]
    rows, angles, clients = [], {}, []
    for method, state in models.items():
        model = outcome.new_model().to(device)
        model.load_state_dict(state)
        test = evaluate(model, splits.test.x, splits.test.y, device=device)
        target = evaluate(model, target_x, target_y, device=device)
        row = {
            "method": method,
            "test_accuracy": test.accuracy,
            "test_loss": test.loss,
            "target_accuracy": target.accuracy,
            "target_loss": target.loss,
            "target_samples": len(target_x),
            "prediction_difference": prediction_difference(model, original, splits.test.x),
            "l2_to_original": l2_distance(state, outcome.final_state),
            "attack_success": poisoning_success_rate(
                model, outcome.data.attack, splits.test, device=device
            ),
            "last_layer_angle_deg": float("nan"),
            "l2_to_fedretrain": float("nan"),
            "seconds": seconds.get(method, float("nan")),
            "speedup_vs_fedretrain": float("nan"),
        }
        if retrained is not None:
            row["last_layer_angle_deg"] = angle_degrees(
                state["head.weight"], retrained["head.weight"]
            )
            row["l2_to_fedretrain"] = l2_distance(state, retrained)
            if method != "fedretrain":
                angles[method] = per_neuron_angles(state["head.weight"], retrained["head.weight"])
            if method in seconds and "fedretrain" in seconds:
                row["speedup_vs_fedretrain"] = seconds["fedretrain"] / seconds[method]
        rows.append(row)
        clients += client_accuracies(outcome.data, model, method, remaining)
    table = with_worst_client(pd.DataFrame(rows), pd.DataFrame(clients))
    return table, angles, pd.DataFrame(clients)


def client_accuracies(data, model, method: str, clients: list[int]) -> list[dict]:
    """Each of ``clients``' accuracy under ``model``: the test set's per-class accuracies weighted
    by the client's labels (:func:`fedunlearn.unlearning.metrics.client_accuracy`), one row each
    (``method``, ``client``, ``accuracy``)."""
    test, classes = data.splits.test, data.splits.num_classes
    per_class = class_accuracies(model, test.x, test.y, classes)
    rows = []
    for k in clients:
        counts = torch.bincount(data.client_split(k).y, minlength=classes)
        rows.append({"method": method, "client": k, "accuracy": client_accuracy(per_class, counts)})
    return rows


def with_worst_client(table: pd.DataFrame, clients: pd.DataFrame) -> pd.DataFrame:
    """``table`` with, per method, the remaining client that lost the most accuracy against the
    original model (``worst_client``), its accuracy and its drop in points (positive: lost): the
    damage unlearning did to those who stay."""
    table = table.copy()
    if clients.empty or not (clients["method"] == "fedavg").any():
        table["worst_client"] = table["worst_client_accuracy"] = table["worst_client_drop"] = (
            math.nan
        )
        return table
    before = clients[clients["method"] == "fedavg"].set_index("client")["accuracy"]
    worst = {}
    for method, part in clients.groupby("method", sort=False):
        drops = 100 * (before.reindex(part["client"]).to_numpy() - part["accuracy"].to_numpy())
        i = int(pd.Series(drops).fillna(-math.inf).to_numpy().argmax())
        worst[method] = (
            int(part["client"].iloc[i]),
            float(part["accuracy"].iloc[i]),
            float(drops[i]),
        )
    table["worst_client"] = [worst.get(m, (math.nan,) * 3)[0] for m in table["method"]]
    table["worst_client_accuracy"] = [worst.get(m, (math.nan,) * 3)[1] for m in table["method"]]
    table["worst_client_drop"] = [worst.get(m, (math.nan,) * 3)[2] for m in table["method"]]
    return table


def with_costs(table: pd.DataFrame, runner: MethodRunner, store) -> pd.DataFrame:
    """``table`` with each method's cost (:mod:`server.federation.metering`): client-epochs (the
    leaving client's included), the megabytes it exchanged with clients, the megabytes of history
    its retention policy kept, and whether the leaving client worked for it."""
    table = table.copy()
    costs = [runner.costs.get(method) for method in table["method"]]
    table["client_epochs"] = [c.client_epochs if c else 0.0 for c in costs]
    table["communication_mb"] = [
        (c.bytes_sent + c.bytes_received) / 1e6 if c else 0.0 for c in costs
    ]
    table["retained_mb"] = [retained_bytes(store, m) / 1e6 for m in table["method"]]
    # a different promise: the leaving client worked during the request (allowed by the config)
    table["target_participated"] = [
        m in UNLEARNING and UNLEARNING[m].target_participates for m in table["method"]
    ]
    return table


def with_verdicts(
    table: pd.DataFrame, details: dict, flag_gap: float, attack_forgotten: bool = False
) -> pd.DataFrame:
    """``table`` with what each method did (``did``, its ``details["did"]``), the round it rolled
    back to where it rolled back (``rollback_round``), its forgetting verdict where the request
    forgets a client that planted a backdoor (``forgetting``,
    :func:`fedunlearn.unlearning.verdicts.forgetting_labels`) and its flag
    (:func:`fedunlearn.unlearning.verdicts.flag_rows`: ``""`` when its row is a result)."""
    table = table.copy()
    own = [details.get(method, {}) for method in table["method"]]
    table["did"] = [
        d.get("did", "the original model" if m == "fedavg" else "")
        for m, d in zip(table["method"], own)
    ]
    table["rollback_round"] = [d.get("rollback_round", float("nan")) for d in own]
    table["forgetting"] = forgetting_labels(table, flag_gap, attack_forgotten)
    table["flag"] = flag_rows(table, flag_gap, attack_forgotten, diverged_methods(details))
    return table


def with_keep_training(table: pd.DataFrame, details: dict) -> pd.DataFrame:
    """``table`` with keep-training read at each method's own cost, when the request ran it: its
    test accuracy and backdoor success after at least as many client-epochs as the method spent
    (:func:`fedunlearn.unlearning.keep_training.at_client_epochs`; NaN beyond its curve), and how
    many points of backdoor success the method removed beyond it (``forgot_beyond_keep_training``:
    positive, the method forgot more than training on without the target at equal cost)."""
    curve = details.get(KEEP_TRAINING, {}).get("curve")
    table = table.copy()
    columns = ("keep_training_test_accuracy", "keep_training_attack_success")
    if not curve:
        for column in (*columns, "forgot_beyond_keep_training"):
            table[column] = math.nan
        return table
    points = [at_client_epochs(curve, epochs) or {} for epochs in table["client_epochs"]]
    own = table["method"].isin(["fedavg", KEEP_TRAINING]).to_numpy()
    for column, key in zip(columns, ("test_accuracy", "attack_success")):
        values = [p.get(key, math.nan) for p in points]
        table[column] = [math.nan if o else v for o, v in zip(own, values)]
    table["forgot_beyond_keep_training"] = 100 * (
        table["keep_training_attack_success"] - table["attack_success"]
    )
    return table


def retained_bytes(store, method: str) -> int:
    """Bytes of the history ``method``'s retention policies kept (0 for a method that reads
    none, such as FedRetrain, or for the trained model)."""
    policy = UNLEARNING[method].policy() if method in UNLEARNING else None
    if store is None or policy is None:
        return 0
    if not policy.keeps_rounds:
        return load_policy(store, policy, method=method).state_bytes()
    return history(store, policy.name, method=method).total_bytes()


def retained_blobs_of(store, targets: list[int]) -> int:
    """How many retained blobs of ``targets`` ``store`` holds (deleted with the old history when
    the request's trajectory is adopted, :mod:`server.unlearning.adoption`)."""
    return 0 if store is None else sum(store.client_blob_count(t) for t in targets)
