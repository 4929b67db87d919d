"""Certified removal (Guo et al. 2020) on the federated model's linear head: the server-side plug-in.

The body of the trained federated model is the feature extractor. The server holds the head, the
perturbation b and the list of removed samples; the clients return sums over their features
(``query.certified_head``, see ``clients/head_queries.py``). :class:`FederatedHeadData` turns those
messages into the :class:`fedunlearn.certified.head_data.HeadData` interface, so the same engine
(:class:`fedunlearn.certified.removal.CertifiedHead`) trains and unlearns centrally and federated.

A sample is named ``(partition id, local index)``, two integers (nothing is coerced). A removal
request names samples of one or more clients, or a whole client; only the clients holding removed
samples are asked for their parts. Clients are other organisations' machines: every reply is
validated (:mod:`server.certified.replies`) and a bad one stops the request, which then leaves
the head, b, beta, the removed lists and the ledger as they were (the engine's transaction).

b never leaves the server's memory: it is drawn from the operating system at every (re)training,
and only the final head is written (the trained head, with the data, would determine b).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from fedunlearn.certified.certificate import CertifiedRemovalParams
from fedunlearn.certified.features import head_features
from fedunlearn.certified.head_data import CentralHeadData, id_list, is_integer_id
from fedunlearn.certified.losses import one_vs_rest_targets, predict_labels
from fedunlearn.certified.removal import CertifiedHead
from fedunlearn.certified.statistics import HeadSums, RemovedParts, StepSums, unpack_symmetric
from fedunlearn.config import ExperimentConfig
from fedunlearn.data.federated_data import run_settings
from fedunlearn.errors import ConfigError
from fedunlearn.messages import HEAD_QUERY
from fedunlearn.plots import plot_certified_removal
from fedunlearn.seeding import derive_seed
from fedunlearn.store.run_directory import CERTIFIED_LEDGER
from server.certified.replies import (
    BadReplyError,
    CheckedReply,
    Expectation,
    QueryFailedError,
    check_reply,
    expected_shapes,
)
from server.federation.members import FederationMembers
from server.federation.queries import query_nodes
from server.progress import Log

SampleId = tuple[int, int]


def model_digest(state: Mapping[str, torch.Tensor]) -> str:
    """A short digest of a model's parameters: the clients' feature cache key."""
    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(name.encode())
        digest.update(state[name].detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


class FederatedHeadData:
    """:class:`fedunlearn.certified.head_data.HeadData` over a federation's clients.

    Every reply is validated before it is used (:mod:`server.certified.replies`): from the node
    asked, the op's arrays with their exact shapes, finite floating values, and counts equal to the
    samples the server believes the partition holds; a bad one raises
    :class:`server.certified.replies.BadReplyError` naming the node and partition.

    Parameters
    ----------
    grid : Grid
    members : FederationMembers
        Node id and declared sample count N_k of every partition (from discovery).
    model_state : mapping
        The trained federated model; its body computes the features on each client.
    loss : str
    classes : sequence of int
        Labels of the one-vs-rest heads (two classes: one binary head).
    partitions : iterable of int, optional
        The clients whose data forms D (default: every client still taking part).
    settings : mapping, optional
        The run's data settings (:func:`fedunlearn.data.federated_data.run_settings`), sent with every
        query so that clients compute on the partitions the run was trained with.
    timeout : float (default: 3600)
        Seconds to wait for the replies to one query (the run's ``reply-timeout``).
    log : Log, optional
        Where the heartbeat lines of a long query go (:mod:`server.federation.queries`).
    """

    def __init__(
        self,
        grid: Grid,
        members: FederationMembers,
        model_state: Mapping[str, torch.Tensor],
        loss: str,
        classes: Sequence[int],
        *,
        partitions: Iterable[int] | None = None,
        settings: Mapping[str, Any] | None = None,
        timeout: float = 3600.0,
        log: Log | None = None,
    ) -> None:
        self.grid = grid
        self.timeout, self.log = timeout, log
        self.settings = dict(settings or {})  # the run's data settings, sent with every query
        self.loss = loss
        self.classes = [int(c) for c in classes]
        self.num_heads = 1 if len(self.classes) == 2 else len(self.classes)
        self.partitions = sorted(members.partition_ids if partitions is None else partitions)
        self.node_of = {p: members.node_of_partition[p] for p in self.partitions}
        self.model_state = dict(model_state)
        self.model_id = model_digest(self.model_state)
        self.removed_ids: dict[int, set[int]] = {p: set() for p in self.partitions}
        self.messages = 0
        self.model_resends = 0
        self.dim = 0  # known after prepare; the replies' shapes follow from it
        declared = {p: int(members.num_examples[p]) for p in self.partitions}
        replies = self._ask(
            "prepare",
            self.partitions,
            {},
            lambda p: Expectation(expected_shapes("prepare", heads=0, dim=0), (1, declared[p])),
            attach_model=True,
        )
        self.sizes = {p: r.count for p, r in replies.items()}
        dims = {p: int(r.arrays["dim"][0]) for p, r in replies.items()}
        for p, dim in dims.items():
            if dim < 1 or dim != dims[self.partitions[0]]:
                raise BadReplyError(
                    self.node_of[p],
                    p,
                    "prepare",
                    f"feature width {dim}; partition {self.partitions[0]} reported "
                    f"{dims[self.partitions[0]]} (the same body gives every client the same width)",
                )
        self.dim = dims[self.partitions[0]]

    # ------------------------------------------------------------------ messaging
    def _ask(
        self,
        op: str,
        partitions: Sequence[int],
        head: Mapping[str, np.ndarray],
        expect: Callable[[int], Expectation],
        *,
        attach_model: bool = False,
        extra: Mapping[int, Mapping[str, Any]] | None = None,
        **config: Any,
    ) -> dict[int, CheckedReply]:
        """Send one query to each partition; the validated replies by partition id."""
        pending = list(partitions)
        answers: dict[int, CheckedReply] = {}
        for attempt in range(2):
            messages = [
                self._message(op, p, head, attach_model or attempt > 0, extra, config)
                for p in pending
            ]
            asked = {self.node_of[p]: p for p in pending}
            self.messages += len(messages)
            replies = query_nodes(
                self.grid,
                messages,
                op=op,
                who="certified head",
                timeout=self.timeout,
                partition_of=asked,
                log=self.log,
            )
            retry = []
            for node, reply in replies.items():
                p = asked[node]
                checked = check_reply(reply.content, op, expect(p), node=node, partition=p)
                if checked.needs_model:
                    retry.append(p)  # the client lost its feature cache: resend the body
                else:
                    answers[p] = checked
            if not retry:
                return answers
            pending = sorted(retry)
            self.model_resends += len(retry)
        raise QueryFailedError(
            f"certified head: clients {pending} (nodes {[self.node_of[p] for p in pending]}) "
            "could not compute their features even with the body attached"
        )

    def _message(self, op, partition, head, attach_model, extra, config) -> Message:
        record = {
            "op": op,
            "model-id": self.model_id,
            "loss": self.loss,
            "classes": self.classes,
            "removed": sorted(self.removed_ids[partition]),
            **self.settings,
            **config,
            **dict((extra or {}).get(partition, {})),
        }
        content = RecordDict({"config": ConfigRecord(record)})
        if head:
            content["head"] = ArrayRecord(
                {k: Array(np.ascontiguousarray(v)) for k, v in head.items()}
            )
        if attach_model:
            content["model"] = ArrayRecord(self.model_state)
        return Message(
            content=content, dst_node_id=self.node_of[partition], message_type=HEAD_QUERY
        )

    def _present(self, partition: int) -> int:
        return self.sizes[partition] - len(self.removed_ids[partition])

    def _expect(self, op: str, **shape_options: Any) -> Callable[[int], Expectation]:
        """Replies to ``op`` over each partition's present samples (sums, gram, step)."""
        shapes = expected_shapes(op, heads=self.num_heads, dim=self.dim, **shape_options)
        summed = "count" in shapes

        def expect(p: int) -> Expectation:
            n = self._present(p)
            return Expectation(shapes, (n, n), n if summed else None)

        return expect

    # ------------------------------------------------------------------ HeadData
    def count(self) -> int:
        return sum(self._present(p) for p in self.partitions)

    def sums(
        self, weights: np.ndarray, *, hessian: bool, single_precision: bool = False
    ) -> HeadSums:
        # Clients always form float64 Hessians (single_precision is a central-data speed option).
        replies = self._ask(
            "sums",
            self.partitions,
            {"weights": weights},
            self._expect("sums", hessian=hessian),
            hessian=hessian,
        )
        parts = [HeadSums.from_arrays(replies[p].arrays) for p in self.partitions]
        return sum(parts[1:], parts[0])

    def gram(self) -> np.ndarray:
        replies = self._ask("gram", self.partitions, {}, self._expect("gram"))
        return sum(unpack_symmetric(replies[p].arrays["gram"], self.dim) for p in self.partitions)

    def _grouped(self, ids: Sequence[Hashable]) -> dict[int, list[int]]:
        grouped: dict[int, list[int]] = {}
        seen: set[SampleId] = set()
        for sample in id_list(ids):
            partition, index = _sample_id(sample)
            if partition not in self.removed_ids:
                raise ConfigError("ids", sample, f"a partition among {self.partitions}")
            if not 0 <= index < self.sizes[partition]:
                raise ConfigError("ids", sample, f"a local index in [0, {self.sizes[partition]})")
            if index in self.removed_ids[partition]:
                raise ConfigError(
                    "ids", sample, "a sample still in the training set (it was removed)"
                )
            if (partition, index) in seen:
                raise ConfigError("ids", sample, "each sample at most once per request")
            seen.add((partition, index))
            grouped.setdefault(partition, []).append(index)
        if not grouped:
            raise ConfigError(
                "ids", list(ids), "a non-empty list of (partition id, local index) pairs"
            )
        return grouped

    def removed(
        self, ids: Sequence[Hashable], weights: np.ndarray, anchor: np.ndarray | None
    ) -> RemovedParts:
        grouped = self._grouped(ids)
        head = {"weights": weights} if anchor is None else {"weights": weights, "anchor": anchor}

        def expect(p: int) -> Expectation:
            m = len(grouped[p])
            shapes = expected_shapes(
                "removed", heads=self.num_heads, dim=self.dim, removed=m, factor=anchor is not None
            )
            return Expectation(shapes, (self._present(p), self._present(p)), m)

        replies = self._ask(
            "removed",
            sorted(grouped),
            head,
            expect,
            extra={p: {"ids": grouped[p]} for p in grouped},
        )
        parts = [RemovedParts.from_arrays(replies[p].arrays) for p in sorted(grouped)]
        return sum(parts[1:], parts[0])

    def drop(self, ids: Sequence[Hashable]) -> None:
        grouped = self._grouped(ids)
        self.removed_ids = {
            p: removed | set(grouped.get(p, ())) for p, removed in self.removed_ids.items()
        }

    def snapshot(self) -> object:
        return {p: frozenset(removed) for p, removed in self.removed_ids.items()}

    def restore(self, state: object) -> None:
        saved: Mapping[int, frozenset[int]] = state  # type: ignore[assignment]
        self.removed_ids = {p: set(removed) for p, removed in saved.items()}

    def step(
        self,
        weights: np.ndarray,
        anchor: np.ndarray,
        step: np.ndarray,
        *,
        hessian_vector: bool = True,
    ) -> StepSums:
        replies = self._ask(
            "step",
            self.partitions,
            {"weights": weights, "anchor": anchor, "step": step},
            self._expect("step"),
            **{"hessian-vector": hessian_vector},
        )
        parts = [StepSums.from_arrays(replies[p].arrays) for p in self.partitions]
        return sum(parts[1:], parts[0])

    def present(self, partition: int) -> list[int]:
        """Local indices of ``partition``'s samples still in D'."""
        return [i for i in range(self.sizes[partition]) if i not in self.removed_ids[partition]]


def _sample_id(sample: object) -> SampleId:
    """A (partition id, local index) pair of integers; nothing is coerced."""
    if isinstance(sample, (str, bytes)) or not isinstance(sample, (tuple, list, np.ndarray)):
        raise ConfigError("ids", sample, "(partition id, local index) pairs of integers")
    values = list(sample)
    if len(values) != 2 or not all(is_integer_id(v) for v in values):
        raise ConfigError(
            "ids", sample, "(partition id, local index) pairs of integers (no bool, float or str)"
        )
    return int(values[0]), int(values[1])


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
