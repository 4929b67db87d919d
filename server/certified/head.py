"""Certified removal (Guo et al. 2020) on the federated model's linear head: the server-side plug-in.

The body of the trained federated model is the feature extractor. The server holds the head, the
perturbation b and the list of removed samples; the clients return sums over their features
(``query.certified_head``, see ``clients/head_queries.py``).
:class:`server.certified.head_data.FederatedHeadData` turns those messages into the
:class:`fedunlearn.certified.head_data.HeadData` interface, so the same engine
(:class:`fedunlearn.certified.removal.CertifiedHead`) trains and unlearns centrally and federated;
this module trains the head on it and streams the removal requests.

b never leaves the server's memory: it is drawn from the operating system at every (re)training,
and only the final head is written (the trained head, with the data, would determine b).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from flwr.serverapp import Grid

from fedunlearn.certified.certificate import CertifiedRemovalParams
from fedunlearn.certified.features import head_features
from fedunlearn.certified.head_data import CentralHeadData
from fedunlearn.certified.losses import one_vs_rest_targets, predict_labels
from fedunlearn.certified.removal import CertifiedHead
from fedunlearn.config import ExperimentConfig
from fedunlearn.data.federated_data import run_settings
from fedunlearn.plots import plot_certified_removal
from fedunlearn.seeding import derive_seed
from fedunlearn.store.run_directory import CERTIFIED_LEDGER
from server.certified.head_data import FederatedHeadData, SampleId
from server.progress import Log

#: The one tensor of a saved certified head (``certified_head*.safetensors``): the (K, d) weights on
#: :func:`fedunlearn.certified.features.head_features` of the run's final model.
HEAD_WEIGHTS = "certified_head.weights"


def save_head(run, name: str, weights: np.ndarray) -> None:
    """Save a certified head's weights as ``<name>.safetensors`` (key :data:`HEAD_WEIGHTS`, float64).

    Only the final, published head may be written: any head together with the data it was trained
    on, before a removal moved it, determines b.
    """
    run.save_model(name, _head_state(weights))


def certified_params(config: ExperimentConfig) -> CertifiedRemovalParams:
    """The engine's settings from the run config's certified group (``certified-*`` keys)."""
    return CertifiedRemovalParams.from_group(config.certified)


@dataclass
class CertifiedHeadRun:
    """What :func:`run_certified_head` leaves for the rest of the run.

    ``trained`` is the trained head ``{HEAD_WEIGHTS: (K, d) float64}`` *in memory only*: with the
    clients' data it determines b exactly (``b = -grad L(w; D) - lambda n w``), so it is never
    written; the membership audit receives it from here (:func:`audit_models`).
    """

    table: pd.DataFrame
    trained: dict[str, torch.Tensor]

    def audit_models(self) -> dict[str, dict[str, torch.Tensor]]:
        """The in-memory models for :func:`server.audit.membership.run_membership_audit`."""
        return {"certified-head-trained": self.trained}


def _head_state(weights: np.ndarray) -> dict[str, torch.Tensor]:
    return {HEAD_WEIGHTS: torch.from_numpy(np.array(weights, dtype=np.float64))}


def run_certified_head(
    grid: Grid, outcome, *, log: Log = print, dp_epsilon: float = 0.0
) -> CertifiedHeadRun:
    """Certified head on the trained model, then a stream of removal requests (table, plot, ledger).

    b is drawn from the operating system's randomness at every (re)training and never written; a
    run reopened after a restart retrains the head with a fresh b. Writes to the run directory:
    ``certified_removal.jsonl`` (one certificate per request), ``certified_removal.csv/.md`` (test
    accuracy and beta every ``certified-eval-every`` requests), ``certified_removal.png``,
    ``certified_summary.json`` and the final head only (``certified_head.safetensors``, see
    :func:`save_head`; its SHA-256 is the last certificate's ``weights_sha256``).
    """
    config: ExperimentConfig = outcome.config
    run = outcome.run
    classes = list(range(outcome.data.splits.num_classes))
    model = outcome.new_model()
    model.load_state_dict(outcome.final_state)
    params = certified_params(config)
    head, data, summary = _train_head(grid, outcome, params, classes, dp_epsilon, log)
    trained = _head_state(head.weights)
    accuracy = _test_accuracy(head, model, outcome.data.splits.test, classes)
    summary["test_accuracy_trained"] = accuracy()
    log(
        f"certified head: trained on {summary['n']} samples x {data.dim} features in "
        f"{summary['train_seconds']:.1f} s, test accuracy {summary['test_accuracy_trained']:.4f}, "
        f"budget {head.budget:.4g}"
    )
    if config.certified_verify_central:
        summary.update(_verify_central(outcome, model, head, params, classes, log))

    requests = _plan_requests(config, data)
    rows, retrained, seconds = _stream_requests(config, head, requests, accuracy, log)
    table = pd.DataFrame(rows)
    run.write_table("certified_removal", table)
    save_head(run, "certified_head", head.weights)
    summary.update(
        {
            "requests": len(requests),
            "retrains": len(retrained),
            "median_request_seconds": float(np.median(seconds)) if seconds else float("nan"),
            "test_accuracy_final": accuracy(),
            "beta_final": head.beta,
            "messages": data.messages,
            "model_resends": data.model_resends,
        }
    )
    run.write_json("certified_summary.json", summary)
    plot_certified_removal(
        table,
        head.budget,
        run.path / "certified_removal.png",
        title=f"certified removal: run {run.path.name} ({config.dataset}, K={config.num_clients})",
        retrained=retrained,
    )
    return CertifiedHeadRun(table, trained)


def _train_head(grid: Grid, outcome, params, classes, dp_epsilon: float, log: Log):
    """The federation's head data and the certified head trained on it (its ledger in the run
    directory), with the first entries of the run's summary."""
    config: ExperimentConfig = outcome.config
    dp_delta = config.dp_delta if config.dp_noise_multiplier > 0 else 0.0
    log("certified head: clients compute the body's features")
    data = FederatedHeadData(
        grid,
        outcome.members,
        outcome.final_state,
        params.loss,
        classes,
        settings=run_settings(config),
        timeout=config.reply_timeout,
        log=log,
    )
    head = CertifiedHead(
        data,
        params,
        ledger=outcome.run.path / CERTIFIED_LEDGER,
        dp_epsilon=dp_epsilon,
        dp_delta=dp_delta,
    )
    start = time.perf_counter()
    head.fit()
    summary: dict[str, Any] = {
        "n": data.count(),
        "dim": data.dim,
        "heads": data.num_heads,
        "budget": head.budget,
        "train_seconds": time.perf_counter() - start,
        "dp_epsilon": dp_epsilon,
        "dp_delta": dp_delta,
    }
    return head, data, summary


def _test_accuracy(head: CertifiedHead, model, test, classes) -> Callable[[], float]:
    """The head's test accuracy now, on the body's features of the test set (computed once)."""
    test_x = head_features(model, test.x)
    test_y = test.y.numpy()

    def accuracy() -> float:
        return float(np.mean(predict_labels(head.scores(test_x), classes) == test_y))

    return accuracy


def _stream_requests(config: ExperimentConfig, head: CertifiedHead, requests, accuracy, log: Log):
    """Send ``requests`` to ``head`` one by one; a table row (and a log line) every
    ``certified-eval-every`` requests, after each whole client and after the last. Returns the rows,
    the requests that retrained the head and each request's seconds."""
    rows = [_row(0, head, accuracy(), 0, 0.0, "trained")]
    retrained, seconds = [], []
    for number, (kind, ids) in enumerate(requests, start=1):
        certificate = head.remove(ids)
        if certificate.retrained:
            retrained.append(number)
        retrains = len(retrained)
        seconds.append(certificate.seconds)
        last = number == len(requests)
        if kind == "client" or number % config.certified_eval_every == 0 or last:
            label = f"client {ids[0][0]}" if kind == "client" else "samples"
            rows.append(_row(number, head, accuracy(), retrains, float(np.median(seconds)), label))
            log(
                f"certified head: {number}/{len(requests)} requests, beta {head.beta:.4g} / "
                f"{head.budget:.4g}, retrains {retrains}, test accuracy {rows[-1]['test_accuracy']:.4f}"
            )
    return rows, retrained, seconds


def _plan_requests(config: ExperimentConfig, data: FederatedHeadData):
    """``certified-removals`` single samples drawn (run seed) across the clients that do not go
    whole, then one request per client of ``certified-remove-clients``."""
    rng = np.random.default_rng(derive_seed(config.seed, "certified-requests"))
    whole = config.certified_client_targets
    pool = [(p, i) for p in data.partitions if p not in whole for i in range(data.sizes[p])]
    chosen = rng.choice(
        len(pool), size=min(config.certified_removals, len(pool) - 1), replace=False
    )
    requests: list[tuple[str, list[SampleId]]] = [("sample", [pool[int(j)]]) for j in chosen]
    requests += [("client", [(p, i) for i in data.present(p)]) for p in whole]
    return requests


def _row(
    requests: int, head: CertifiedHead, accuracy: float, retrains: int, seconds: float, kind: str
):
    return {
        "requests": requests,
        "kind": kind,
        "remaining": head.data.count(),
        "test_accuracy": accuracy,
        "beta": head.beta,
        "budget": head.budget,
        "worst_case": head.worst_case,
        "retrains": retrains,
        "median_request_seconds": seconds,
    }


def _verify_central(outcome, model, head, params, classes, log: Log) -> dict[str, float]:
    """Fit the same head (same b, handed over in memory) centrally on every client's features
    (possible in simulation only, where the server can rebuild the partitions) and report the
    relative difference."""
    xs, ys = [], []
    for partition in head.data.partitions:
        split = outcome.data.client_split(partition)
        xs.append(head_features(model, split.x))
        ys.append(split.y.numpy())
    central = CertifiedHead(
        CentralHeadData(
            params.loss, np.vstack(xs), one_vs_rest_targets(np.concatenate(ys), classes)
        ),
        params,
    )
    central.fit(perturbation=head.perturbation)  # the same b, from memory
    difference = float(
        np.linalg.norm(head.weights - central.weights)
        / max(np.linalg.norm(central.weights), 1e-300)
    )
    log(f"certified head: federated vs centralized head, relative difference {difference:.3g}")
    return {"central_relative_difference": difference}
