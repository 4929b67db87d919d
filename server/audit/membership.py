"""The platform's verdict on unlearning: every model a run produced, attacked by every membership-
inference attack, in one table judged against FedRetrain (math in
:mod:`fedunlearn.membership.evaluation`).

With ``mia = true`` the ServerApp, after training, unlearning (``unlearn-clients``: one target) and
scrubbing (``scrub-forget = client:<target>``), collects the models the registries list
(:func:`fedunlearn.registry.audited_models`: the original, every unlearning and scrubbing method,
the certified heads; each entry names the file its plug-in saved: a full model, or a certified head
on the final model's features; the trained certified head is never written and comes in memory from
``run_certified_head``), trains ``mia-reference-models`` reference models without the target for
offline LiRA (FedRetrain from differently seeded initial weights), and attacks each model on the
target's data against as many unseen held-out samples. The held-out set (the training samples no client
holds when ``train-samples`` leaves enough, else the test split) is cut in two disjoint halves: one
trains the shadow attack, the other is the evaluation's non-members. In a simulation the server
rebuilds the target's data from the run config to measure (no method reads it).

Outputs: ``membership.csv/.md`` (methods x test accuracy, target accuracy, shadow precision / recall
/ F1 / AUC, threshold AUC and TPR at 1% / 0.1% FPR, LiRA AUC and TPR at 0.1% FPR, gaps to
FedRetrain, verdict, seconds), ``membership_roc.png`` (log-log ROC of the loss attack and LiRA).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from fedunlearn.certified.features import head_features
from fedunlearn.certified.losses import class_probabilities
from fedunlearn.membership.attacks import disjoint_indices, split_held_out
from fedunlearn.membership.evaluation import MembershipAudit, ModelOutputs, softmax_outputs
from fedunlearn.membership.lira import logit_confidence
from fedunlearn.plots import plot_roc_curves
from fedunlearn.registry import REFERENCE, UNLEARNING, audited_models
from fedunlearn.seeding import derive_seed
from fedunlearn.store.run_directory import SCRUBBING_LOG, UNLEARNING_LOG
from fedunlearn.training.local import resolve_device
from server.certified.head import HEAD_WEIGHTS
from server.progress import Log
from server.training.rounds import TrainingOutcome, participant_rounds

Probabilities = Callable[[torch.Tensor], np.ndarray]

def shadow_of(name: str) -> str | None:
    """The shadow model of an audited method whose outputs are not the original network's softmax
    (``options["shadow"]`` of its registry entry): FedEraser's attack learns what the original's
    softmax looks like on members, which says little about a linear head's normalised sigmoids, so
    the certified head's rows use the trained head as their shadow (when the run handed it over).
    Every other method (None) uses the original model."""
    return dict(audited_models())[name].options.get("shadow")


@dataclass
class AuditData:
    """The audit's disjoint samples: the target's data and as many unseen held-out samples (the
    evaluation), and the shadow attack's members and non-members."""

    target: object  # the target's split (x, y)
    x_unseen: torch.Tensor
    y_unseen: torch.Tensor
    x_shadow_members: torch.Tensor
    x_shadow_nonmembers: torch.Tensor


def run_membership_audit(
    grid,
    outcome: TrainingOutcome,
    *,
    log: Log = print,
    in_memory: Mapping[str, Mapping[str, torch.Tensor]] | None = None,
) -> pd.DataFrame:
    """Attack every model of the run that :func:`fedunlearn.registry.audited_models` lists;
    returns the judged table.

    ``in_memory``: method name -> state dict of models that are audited without ever being written
    (the trained certified head, :meth:`server.certified.head.CertifiedHeadRun.audit_models`); a
    method found here is not read from its file.
    """
    config = outcome.config
    target = config.unlearn_targets[0]
    device = resolve_device(config.device)
    data = _audit_data(outcome, target, log)
    model = outcome.new_model()

    def outputs(state) -> ModelOutputs:
        probabilities = _probabilities(model, state, outcome, device)
        return _outputs(probabilities, data.target, data.x_unseen, data.y_unseen)

    model.load_state_dict(outcome.final_state)
    audit = MembershipAudit(
        softmax_outputs(model, data.x_shadow_members, device=device),
        softmax_outputs(model, data.x_shadow_nonmembers, device=device),
        seed=config.seed,
    )
    reference_phi = _reference_confidences(grid, outcome, target, outputs, log)
    seconds = _seconds(outcome.run)
    states = _audited_states(outcome.run, in_memory or {})
    log(f"membership audit of {len(states)} model(s): {', '.join(states)}")
    shadows: dict[str, object] = {}
    for name, load_state in states.items():
        probabilities = _probabilities(model, load_state(), outcome, device)
        shadow_name = shadow_of(name) if shadow_of(name) in states else None
        if shadow_name and shadow_name not in shadows:
            shadow_probabilities = _probabilities(model, states[shadow_name](), outcome, device)
            shadows[shadow_name] = audit.fit_shadow(
                shadow_probabilities(data.x_shadow_members),
                shadow_probabilities(data.x_shadow_nonmembers),
            )
        scored = _outputs(probabilities, data.target, data.x_unseen, data.y_unseen)
        test = outcome.data.splits.test
        audit.audit(
            name,
            scored,
            lira_reference_phi=reference_phi,
            shadow=shadows.get(shadow_name) if shadow_name else None,
            extra={
                "test_accuracy": float(
                    np.mean(probabilities(test.x).argmax(axis=1) == test.y.numpy())
                ),
                "target_accuracy": float(
                    np.mean(scored.target_probs.argmax(axis=1) == scored.target_labels)
                ),
                "seconds": seconds.get(name, float("nan")),
            },
        )
    return _publish(outcome.run, audit, reference_phi, target, log)


def _audit_data(outcome: TrainingOutcome, target: int, log: Log) -> AuditData:
    """Disjoint data: attack training (held-out half A + others' training data), evaluation
    (the target's data + held-out half B, as many as the target's samples)."""
    config = outcome.config
    rng = np.random.default_rng(derive_seed(config.seed, "mia"))
    target_split = outcome.data.client_split(target)
    held_x, held_y, held_name = _held_out(outcome.data, len(target_split.y))
    log(f"membership audit: non-members from the {held_name} ({len(held_y)} samples)")
    attack_half, eval_half = split_held_out(len(held_y), derive_seed(config.seed, "mia-split"))
    disjoint_indices(attack_half, eval_half, names=["attack held-out", "evaluation held-out"])
    n_target = len(target_split.y)
    unseen = np.sort(rng.choice(eval_half, size=min(n_target, len(eval_half)), replace=False))
    others = np.concatenate(
        [outcome.data.partitions[p] for p in range(config.num_clients) if p != target]
    )
    shadow_members = np.sort(
        rng.choice(others, size=min(len(others), len(attack_half)), replace=False)
    )
    return AuditData(
        target_split,
        held_x[unseen],
        held_y[unseen],
        outcome.data.splits.train.x[shadow_members],
        held_x[attack_half],
    )


def _publish(run, audit: MembershipAudit, reference_phi, target: int, log: Log) -> pd.DataFrame:
    """The judged table (against the reference, FedRetrain) and the ROC figure."""
    table = audit.table(reference=REFERENCE)
    run.write_table("membership", table, floatfmt=".4g")
    plot_roc_curves(
        {name: curves["lira"] for name, curves in audit.curves.items()},
        run.path / "membership_roc.png",
        title=f"LiRA (offline, {len(reference_phi)} reference models): client {target}",
    )
    columns = ["method", "test_accuracy", "target_accuracy", "shadow_f1", "loss_auc", "lira_auc"]
    log(
        "membership audit:\n"
        + table[columns + ["verdict"]].to_markdown(index=False, floatfmt=".3f")
    )
    log(f"membership table {run.path / 'membership.csv'}; ROC membership_roc.png")
    return table


def _audited_states(run, in_memory: Mapping[str, Mapping[str, torch.Tensor]]):
    """Method name -> a loader of its state dict, in :func:`audited_models`' order, for the
    methods whose model was handed over in memory or saved in the run directory."""
    states: dict[str, Callable[[], Mapping[str, torch.Tensor]]] = {}
    # This request's unlearned models: a later request's files end in -<request>, and an earlier
    # request's models (still on disk) must not stand in for them.
    requests = run.read_log(UNLEARNING_LOG)
    suffix = requests[-1].get("suffix", "") if requests else ""
    for name, spec in audited_models():
        filename = spec.model_file
        if filename is not None and name in UNLEARNING:
            filename += suffix
        if name in in_memory:
            states[name] = lambda state=in_memory[name]: state
        elif filename is not None and (run.path / f"{filename}.safetensors").is_file():
            states[name] = lambda filename=filename: run.load_model(filename)
    return states


def _held_out(data, n_target: int) -> tuple[torch.Tensor, torch.Tensor, str]:
    """The non-member pool: the training samples no client holds (``train-samples`` > 0), drawn
    exactly like the members, when there are at least ``4 x n_target`` of them; otherwise the test
    split."""
    used = np.zeros(len(data.splits.train), dtype=bool)
    for part in data.partitions:
        used[part] = True
    unused = torch.as_tensor(np.flatnonzero(~used), dtype=torch.long)
    if len(unused) >= 4 * n_target:
        return data.splits.train.x[unused], data.splits.train.y[unused], "unused training samples"
    return data.splits.test.x, data.splits.test.y, "test split"


def _probabilities(model, state, outcome: TrainingOutcome, device) -> Probabilities:
    """The class probabilities a saved file gives: a full model's softmax, or a certified head's
    (:data:`server.certified.head.HEAD_WEIGHTS`) on the features of the run's final model."""
    if set(state) == {HEAD_WEIGHTS}:
        weights = state[HEAD_WEIGHTS].double().numpy()
        body = outcome.new_model()
        body.load_state_dict(outcome.final_state)
        loss = outcome.config.certified_loss
        return lambda x: class_probabilities(
            loss, head_features(body, x, device=device) @ weights.T
        )

    def softmax(x: torch.Tensor) -> np.ndarray:
        model.load_state_dict(state)
        return softmax_outputs(model, x, device=device)

    return softmax


def _outputs(probabilities: Probabilities, target_split, x_unseen, y_unseen) -> ModelOutputs:
    return ModelOutputs(
        probabilities(target_split.x),
        target_split.y.numpy(),
        probabilities(x_unseen),
        y_unseen.numpy(),
    )


def _reference_confidences(grid, outcome: TrainingOutcome, target: int, outputs, log) -> np.ndarray:
    """Logit confidences (m, n_target + n_unseen) of ``mia-reference-models`` models trained
    without the target (offline LiRA): FedRetrain from differently seeded initial weights."""
    config = outcome.config
    others = [p for p in outcome.members.partition_ids if p != target]
    rows = []
    for index in range(config.mia_reference_models):
        started = time.perf_counter()
        torch.manual_seed(derive_seed(config.seed, "mia-reference", index))
        initial = outcome.new_model().state_dict()
        state = participant_rounds(
            grid, outcome, initial, others, name=f"LiRA reference {index + 1}", log=log
        )
        out = outputs(state)
        rows.append(
            np.concatenate(
                [
                    logit_confidence(out.target_probs, out.target_labels),
                    logit_confidence(out.unseen_probs, out.unseen_labels),
                ]
            )
        )
        log(
            f"LiRA reference model {index + 1}/{config.mia_reference_models} (without client "
            f"{target}): {time.perf_counter() - started:.1f}s"
        )
    return np.stack(rows)


def _seconds(run) -> dict[str, float]:
    """Wall time of each method, from the unlearning and scrubbing logs of this run."""
    seconds: dict[str, float] = {}
    for log_name in (UNLEARNING_LOG, SCRUBBING_LOG):
        if (run.path / log_name).is_file():
            for entry in run.read_log(log_name):
                seconds.update(entry.get("seconds", {}))
    return seconds
