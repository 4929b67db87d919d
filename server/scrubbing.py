"""Scrubbing the federated model (Golatkar et al., *Eternal Sunshine of the Spotless Net*): the
server-side plug-in, its baselines and readouts.

After training, the cohort D_f named by ``scrub-forget`` (a class across clients, samples of a client,
or a whole client) is forgotten by every method in ``scrub-methods``; the clients compute the sums the
scrub needs at the model the server sends (``query.scrub_stats``, ``clients/scrub_queries.py``):

* ``newton``: eq. 7 on the linear head, exact: ``B = H_Dr / n_r + mu I`` (``scrub-damping`` mu) and
  ``grad L_Dr`` from the clients' D_r sums; noise ``(lambda sigma_h^2)^{1/4} B^{-1/4} n``.
* ``newton-forget-only``: Section 3.2, ``B = H_D - H_Df`` and ``grad L_Dr = -grad L_Df`` (valid at a
  minimum of L_D); H_D is the cache of the head's Hessian at the end of training (both parts, one
  query) and, at forgetting time, only the clients holding D_f compute anything new.
* ``newton-finite``: eq. 6 (:func:`fedunlearn.scrubbing.scrubbers.finite_time_scrub`), time ``scrub-time``
  (eta t; 0 = lr times the local SGD steps a client took in training).
* ``fisher`` / ``fisher-sqrt``: Fisher forgetting of the whole network with the diagonal Fisher of
  D_r (eq. 8), std ``(lambda sigma_h^2)^{1/4} F^{-1/4}`` or the appendix's ``F^{-1/2}``; F is floored
  at ``scrub-fisher-floor`` (caps the noise of parameters D_r does not use).
* ``fisher-reference``: the authors' released recipe
  (:func:`fedunlearn.scrubbing.scrubbers.reference_fisher_variance`): ``F^{-1/2}`` with capped variances
  averaged per output unit, and a forgotten class's last-layer row reset to the prior mean.
* Baselines (Section 5.2), as federated rounds with the same clients: ``finetune`` (D_r),
  ``negative-gradient`` and ``random-labels`` (the clients holding D_f), ``hiding`` (server only: the
  class's head row re-initialised; class cohorts only).
* ``retrain`` (FedRetrain without D_f, from the same initial weights and seed) is the reference and
  ``original`` the trained model.

Readouts (Section 5.3): error on D_test, D_f and D_r; relearn time; output-entropy histograms; the
information bound (Proposition 2) between the scrubbed original and the scrubbed retrained model,
over a lambda grid, with the error it costs (the paper's Fig. 2). The readouts use the clients' data,
which the server rebuilds from the run config in a simulation (measurement only: no method reads it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from fedunlearn.errors import ConfigError
from fedunlearn.data.federated_data import run_settings
from fedunlearn.preflight import cohort_masks
from fedunlearn.data.forget_sets import ForgetSet
from fedunlearn.scrubbing.baselines import hide_class
from fedunlearn.certified.curvature import assemble_hessian, head_matrix, with_head
from fedunlearn.scrubbing.readouts import (
    error_rate,
    output_entropy,
    plot_entropy_histograms,
    plot_information_tradeoff,
    plot_relearn_times,
    relearn_time,
)
from fedunlearn.scrubbing.scrubbers import (
    NewtonScrubber,
    finite_time_scrub,
    kl_over_lambda,
    reference_fisher_variance,
)
from fedunlearn.reply_checks import (
    RefusedReply,
    check_array_specs,
    check_count,
    check_finite_arrays,
    check_metrics,
    check_partition,
)
from fedunlearn.seeding import derive_seed
from fedunlearn.training.local import resolve_device
from server.federated_training import TrainingOutcome, participant_rounds
from server.reply_screening import check_sources

SCRUB_QUERY = "query.scrub_stats"
Log = Callable[[str], None]
State = dict[str, torch.Tensor]
#: Fisher forgetting variants: method -> power of F in the noise's standard deviation.
FISHER_POWERS = {"fisher": -0.25, "fisher-sqrt": -0.5}
#: Every Fisher scrub: eq. 8's two powers, and the authors' released recipe
#: (:func:`fedunlearn.scrubbing.scrubbers.reference_fisher_variance`).
FISHER_VARIANTS = ("fisher", "fisher-sqrt", "fisher-reference")


def relearn_check_every(samples: int, batch_size: int) -> int:
    """Steps between D_f-loss checks in the relearn readout: 1/400 of an epoch (relearning a
    forgotten MNIST class takes well under a tenth of an epoch), at least every step."""
    return max(1, -(-samples // batch_size) // 400)


def fisher_lambda(config, kind: str) -> float:
    """The run config's lambda for a Fisher variant (their noise scales differ by orders)."""
    return {
        "fisher": config.scrub_fisher_lambda,
        "fisher-sqrt": config.scrub_fisher_sqrt_lambda,
        "fisher-reference": config.scrub_fisher_reference_lambda,
    }[kind]


#: Samples per split for the entropy histograms.
ENTROPY_SAMPLES = 2000


class ScrubStatistics:
    """Asks clients for sums over their D_r / D_f at a model, checks every reply, adds them up.

    A reply is refused (the query fails, naming the node and the reason; nothing is summed) unless
    it holds exactly the sums asked for, with the shapes the model implies, finite, and counts
    equal to the sizes of the client's D_r / D_f that the server computes from the run config
    (``masks``; capped at ``max-samples`` for the Fisher).
    """

    def __init__(
        self,
        grid: Grid,
        outcome: TrainingOutcome,
        forget: ForgetSet,
        masks: Mapping[int, np.ndarray],
    ) -> None:
        self.grid = grid
        self.members = outcome.members
        self.node_of = dict(outcome.members.node_of_partition)
        self.forget = forget
        self.masks = masks
        self.settings = run_settings(outcome.config)
        self.parameters = {
            name: tuple(tensor.shape) for name, tensor in outcome.new_model().named_parameters()
        }
        self.messages = 0

    def ask(
        self,
        op: str,
        state: Mapping[str, torch.Tensor],
        parts: Sequence[str],
        partitions: Sequence[int],
        **config,
    ) -> dict[str, dict]:
        """``{part: {"count": n, name: summed array}}`` over ``partitions``."""
        record = {"op": op, "parts": list(parts), "forget": str(self.forget), **config}
        messages = [
            Message(
                content=RecordDict(
                    {
                        "config": ConfigRecord({**record, **self.settings}),
                        "model": ArrayRecord(dict(state)),
                    }
                ),
                dst_node_id=self.node_of[p],
                message_type=SCRUB_QUERY,
            )
            for p in partitions
        ]
        replies = list(self.grid.send_and_receive(messages, timeout=3600))
        self.messages += len(messages)
        asked = {self.node_of[p]: p for p in partitions}
        totals: dict[str, dict] = {part: {"count": 0} for part in parts}
        for partition, reply in check_sources(replies, asked, op, who="scrubbing").items():
            counts, arrays = self._checked(reply, partition, op, parts, state, config)
            for part in parts:
                totals[part]["count"] += counts[part]
            for key, value in arrays.items():
                part, name = key.split(".", 1)
                totals[part][name] = totals[part].get(name, 0.0) + value
        return totals

    def _checked(self, reply, partition, op, parts, state, config):
        """(counts per part, arrays as float64) of one reply, or a RuntimeError naming its node."""
        node = reply.metadata.src_node_id
        try:
            content = reply.content
            if set(content.keys()) != {"stats", "metrics"}:
                raise RefusedReply(f"records {sorted(content.keys())}, expected stats and metrics")
            counts = self._expected_counts(partition, parts, op, config)
            metrics = check_metrics(
                content["metrics"], {"partition-id", *(f"{part}.count" for part in parts)}
            )
            check_partition(metrics["partition-id"], partition)
            for part in parts:
                got = check_count(f"{part}.count", metrics[f"{part}.count"], 0, 2**62)
                if got != counts[part]:
                    raise RefusedReply(f"{part}.count = {got}, its {part} part has {counts[part]}")
            specs = self._expected_arrays(op, parts, counts, state, config)
            stats = content["stats"]
            check_array_specs(specs, {k: (tuple(a.shape), a.dtype) for k, a in stats.items()})
            arrays = {k: a.numpy() for k, a in stats.items()}
            check_finite_arrays(arrays.items())
            sums = list(arrays) if op == "fisher" else [k for k in arrays if k.endswith(".loss")]
            negative = [k for k in sums if (arrays[k] < 0).any()]  # losses and Fishers are >= 0
            if negative:
                raise RefusedReply(f"negative sums in {negative[:3]}")
        except RefusedReply as refused:
            raise RuntimeError(
                f"scrubbing: {op} reply of node {node} (client {partition}) refused: "
                f"{refused.reason}"
            ) from None
        return counts, {k: a.astype(np.float64) for k, a in arrays.items()}

    def _expected_counts(self, partition, parts, op, config) -> dict[str, int]:
        mask = self.masks[partition]
        sizes = {"forgotten": int(mask.sum()), "retained": int((~mask).sum())}
        if op == "fisher":
            limit = int(config["max-samples"])
            sizes = {part: min(size, limit) for part, size in sizes.items()}
        return {part: sizes[part] for part in parts}

    def _expected_arrays(self, op, parts, counts, state, config) -> dict[str, tuple]:
        """(shape, dtype) of every array a reply must hold."""
        if op == "head":
            k, d = head_matrix(state).shape
            shapes = {"loss": ((1,), "float64"), "gradient": ((k, d), "float64")}
            if bool(config.get("hessian", False)):
                shapes["blocks"] = ((k * (k + 1) // 2, d * (d + 1) // 2), "float32")
            return {f"{part}.{n}": spec for part in parts for n, spec in shapes.items()}
        return {
            f"{part}.{name}": (shape, "float64")
            for part in parts
            if counts[part] > 0
            for name, shape in self.parameters.items()
        }


def run_scrubbing(grid: Grid, outcome: TrainingOutcome, *, log: Log = print) -> pd.DataFrame:
    """Forget ``scrub-forget`` with every method in ``scrub-methods``; returns the readout table."""
    config = outcome.config
    splits = outcome.data.splits
    forget = ForgetSet.parse(
        config.scrub_forget, num_clients=config.num_clients, num_classes=splits.num_classes
    )
    methods = config.scrubbing_methods
    partitions = outcome.members.partition_ids
    masks = cohort_masks(config, outcome.data)
    holders = [p for p in partitions if masks[p].any()]
    keepers = [p for p in partitions if (~masks[p]).any()]
    n_forget = int(sum(m.sum() for m in masks.values()))
    log(
        f"scrubbing {forget} ({n_forget} samples on {len(holders)} client(s)): {', '.join(methods)}"
    )
    stats = ScrubStatistics(grid, outcome, forget, masks)
    original = outcome.final_state
    models: dict[str, State] = {"original": original}
    seconds: dict[str, float] = {}
    details: dict[str, dict] = {}

    def timed(name: str, build: Callable[[], State]) -> None:
        started = time.perf_counter()
        models[name] = build()
        seconds[name] = time.perf_counter() - started
        outcome.run.save_model(f"model_scrub_{name}", models[name])
        log(f"scrub {name}: {seconds[name]:.1f}s")

    requests = outcome.run.read_log("unlearning_log.jsonl")
    reusable = f"model_fedretrain{requests[-1].get('suffix', '')}" if len(requests) == 1 else None
    if (
        reusable is not None
        and forget.kind == "client"
        and config.unlearn_targets == [forget.client]
        and (outcome.run.path / f"{reusable}.safetensors").is_file()
    ):
        # The unlearning step already retrained without this client (and no one else: the run's
        # first request), from the same initial weights and seeds: the same model, so it is
        # reused rather than trained twice.
        timed("retrain", lambda: outcome.run.load_model(reusable))
        details["retrain_reused"] = reusable
    else:
        timed(
            "retrain",
            lambda: participant_rounds(
                grid,
                outcome,
                outcome.initial_state,
                keepers,
                name="retrain",
                log=log,
                extra_config={"forget": str(forget)},
            ),
        )
    details["retrain"] = {"clients": list(keepers), "rounds": config.rounds}

    head_methods = {"newton", "newton-forget-only", "newton-finite"} & set(methods)
    scrubbers: dict[str, NewtonScrubber] = {}
    if head_methods:
        parts = ("retained", "forgotten")
        started = time.perf_counter()
        head = stats.ask("head", original, parts, partitions, hessian=True)
        w = head_matrix(original)
        k, d = w.shape
        n_r, n_f = head["retained"]["count"], head["forgotten"]["count"]
        hessian_r = assemble_hessian(head["retained"]["blocks"], k, d)
        hessian_f = assemble_hessian(head["forgotten"]["blocks"], k, d)
        damping = config.scrub_damping * np.eye(k * d)
        collect = time.perf_counter() - started
        log(f"head statistics (K={k}, d={d}) from {len(partitions)} clients: {collect:.1f}s")

        def newton(kind: str) -> State:
            if kind == "newton":
                gradient = head["retained"]["gradient"] / n_r
            else:  # Section 3.2: grad L_Dr = -grad L_Df at a minimum of L_D
                gradient = -head["forgotten"]["gradient"] / n_r
            shared = next(iter(scrubbers.values()), None)
            if shared is None:
                # B = H_Dr / n_r + mu I; Section 3.2's H_D - H_Df, with H_D the cached sum of both
                # parts, is the same matrix: one eigendecomposition serves both variants.
                scrubbers[kind] = NewtonScrubber(w, gradient, hessian_r / n_r + damping)
            else:
                scrubbers[kind] = shared.with_gradient(w, gradient)
            rng = np.random.default_rng(derive_seed(config.seed, "scrub", kind))
            sample = scrubbers[kind].sample(config.scrub_newton_lambda, config.scrub_sigma_h, rng)
            return with_head(original, sample)

        for kind in ("newton", "newton-forget-only"):
            if kind in methods:
                timed(kind, lambda kind=kind: newton(kind))
                seconds[kind] += collect

        if "newton-finite" in methods:

            def finite() -> State:
                n = n_r + n_f
                scrubbed = finite_time_scrub(
                    w,
                    (head["retained"]["gradient"] + head["forgotten"]["gradient"]) / n,
                    (hessian_r + hessian_f) / n + damping,
                    head["retained"]["gradient"] / n_r,
                    hessian_r / n_r + damping,
                    config.scrub_newton_lambda,
                    config.scrub_sigma_h,
                    time=_training_time(outcome),
                    rng=np.random.default_rng(derive_seed(config.seed, "scrub", "newton-finite")),
                )
                return with_head(original, scrubbed.weights)

            timed("newton-finite", finite)
            seconds["newton-finite"] += collect
            details["newton-finite"] = {"time": _training_time(outcome)}

    fishers: dict[str, dict[str, np.ndarray]] = {}
    if set(FISHER_VARIANTS) & set(methods):
        started = time.perf_counter()
        fishers["original"] = _fisher(stats, original, keepers, config)
        collect = time.perf_counter() - started
        log(f"diagonal Fisher of D_r from {len(keepers)} clients: {collect:.1f}s")
        for kind in FISHER_VARIANTS:
            if kind in methods:
                timed(
                    kind,
                    lambda kind=kind: _fisher_sample(
                        *_fisher_gaussian(kind, original, fishers["original"], config, forget),
                        fisher_lambda(config, kind),
                        config,
                        kind,
                        original,
                    ),
                )
                seconds[kind] += collect

    baseline_rounds = {
        "finetune": ("train", keepers),
        "negative-gradient": ("negative-gradient", holders),
        "random-labels": ("random-labels", holders),
    }
    for kind, (objective, clients) in baseline_rounds.items():
        if kind in methods:
            extra = {
                "forget": str(forget),
                "objective": objective,
                "local-epochs": config.scrub_baseline_epochs,
            }
            timed(
                kind,
                lambda extra=extra, clients=clients, kind=kind: participant_rounds(
                    grid,
                    outcome,
                    original,
                    clients,
                    name=kind,
                    log=log,
                    rounds=config.scrub_baseline_rounds,
                    extra_config=extra,
                ),
            )
            details[kind] = {"clients": list(clients), "rounds": config.scrub_baseline_rounds}
    if "hiding" in methods:
        if forget.is_class:

            def hiding() -> State:
                model = outcome.new_model()
                model.load_state_dict(original)
                generator = torch.Generator().manual_seed(derive_seed(config.seed, "hiding"))
                hide_class(model, forget.label, generator=generator)
                return {k: v.detach().clone() for k, v in model.state_dict().items()}

            timed("hiding", hiding)
        else:
            log(f"hiding skipped: it hides a class, and {forget} is not one")

    # ------------------------------------------------------------------ readouts
    data = _readout_data(outcome, masks, forget)
    tradeoff = _information_tradeoff(
        stats, outcome, forget, data, models, scrubbers, fishers, keepers, log
    )
    table, entropies = _readouts(outcome, data, models, seconds, tradeoff, log)
    run = outcome.run
    run.write_table("scrubbing", table, floatfmt=".4g")  # lambdas span 1e-12 .. 1e-4
    run.write_table("scrubbing_tradeoff", tradeoff, floatfmt=".4g")
    plot_entropy_histograms(
        entropies, run.path / "scrubbing_entropy.png", num_classes=splits.num_classes
    )
    plot_relearn_times(table, run.path / "scrubbing_relearn.png")
    if not tradeoff.empty:
        plot_information_tradeoff(tradeoff, run.path / "scrubbing_tradeoff.png")
    run.append_log(
        "scrubbing.jsonl",
        {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "forget": str(forget),
            "forgotten_samples": n_forget,
            "holders": holders,
            "methods": methods,
            "seconds": seconds,
            "details": details,
            "messages": stats.messages,
        },
    )
    log("scrubbing results:\n" + table.to_markdown(index=False, floatfmt=".4g"))
    log(f"scrubbing table {run.path / 'scrubbing.csv'}; figures scrubbing_*.png")
    return table


# ---------------------------------------------------------------------- methods
def _training_time(outcome: TrainingOutcome) -> float:
    """eta t for eq. 6: ``scrub-time``, or lr times the SGD steps a client took in training."""
    config = outcome.config
    if config.scrub_time > 0:
        return config.scrub_time
    sizes = list(outcome.members.num_examples.values())
    steps = int(np.ceil(np.mean(sizes) / config.batch_size)) * config.local_epochs * config.rounds
    return config.lr * steps


def _fisher(stats: ScrubStatistics, state: State, keepers, config) -> dict[str, np.ndarray]:
    """The mean diagonal Fisher of D_r at ``state``, per parameter tensor."""
    totals = stats.ask(
        "fisher", state, ("retained",), keepers, **{"max-samples": config.scrub_fisher_samples}
    )["retained"]
    count = max(totals.pop("count"), 1)
    return {name: value / count for name, value in totals.items()}


def _fisher_gaussian(
    kind: str, state: State, fisher: Mapping[str, np.ndarray], config, forget: ForgetSet
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Mean and base variance (the variance at ``sqrt(lambda) sigma_h = 1``) of a Fisher scrub."""
    mean = {name: state[name].detach().double().numpy() for name in fisher}
    if kind == "fisher-reference":
        base, reset = reference_fisher_variance(
            fisher, forget_class=forget.label if forget.is_class else None
        )
        return {name: np.where(reset[name], 0.0, mean[name]) for name in mean}, base
    power = FISHER_POWERS[kind]
    floor = max(config.scrub_fisher_floor, 1e-30)
    return mean, {name: np.maximum(f, floor) ** (2 * power) for name, f in fisher.items()}


def _fisher_sample(mean, base, lam: float, config, kind: str, template: State) -> State:
    """``template`` with its parameters drawn as ``mean + (sqrt(lambda) sigma_h base)^{1/2} n``."""
    scale = np.sqrt(np.sqrt(lam) * config.scrub_sigma_h)
    rng = np.random.default_rng(derive_seed(config.seed, "scrub", kind, lam))
    out = {k: v.detach().clone() for k, v in template.items()}
    for name, m in mean.items():
        drawn = m + scale * np.sqrt(base[name]) * rng.normal(size=m.shape)
        out[name] = torch.as_tensor(drawn).to(out[name].dtype)
    return out


# ---------------------------------------------------------------------- readouts
def _readout_data(outcome: TrainingOutcome, masks, forget: ForgetSet) -> dict:
    """D, D_f, D_r (from the rebuilt partitions), D_test and, for a class, D_test without it."""
    xs, ys, fs = [], [], []
    for p, mask in masks.items():
        split = outcome.data.client_split(p)
        xs.append(split.x)
        ys.append(split.y)
        fs.append(torch.as_tensor(mask))
    x, y, f = torch.cat(xs), torch.cat(ys), torch.cat(fs)
    test = outcome.data.splits.test
    data = {"D": (x, y), "D_f": (x[f], y[f]), "D_r": (x[~f], y[~f]), "D_test": (test.x, test.y)}
    if forget.is_class:
        other = test.y != forget.label
        data["D_test_other"] = (test.x[other], test.y[other])
        data["D_test_class"] = (test.x[~other], test.y[~other])
    return data


def _information_tradeoff(
    stats, outcome, forget, data, models, scrubbers, fishers, keepers, log
) -> pd.DataFrame:
    """Proposition 2's bound in nats and the errors, over ``lambda * scrub-lambda-factors``."""
    config = outcome.config
    retrained = models["retrain"]
    device = resolve_device(config.device)
    rows = []
    model = outcome.new_model()

    def errors(state: State) -> dict[str, float]:
        model.load_state_dict(state)
        names = {"D_f": "error_forget", "D_test": "error_test", "D_test_other": "error_test_other"}
        return {
            column: error_rate(model, *data[name], device=device)
            for name, column in names.items()
            if name in data
        }

    if "newton" in scrubbers:
        head = stats.ask("head", retrained, ("retained",), keepers, hessian=True)["retained"]
        w_r = head_matrix(retrained)
        k, d = w_r.shape
        n_r = head["count"]
        curvature = assemble_hessian(head["blocks"], k, d) / n_r + config.scrub_damping * np.eye(
            k * d
        )
        scrub_r = NewtonScrubber(w_r, head["gradient"] / n_r, curvature)
        scrub_o = scrubbers["newton"]
        lams = [config.scrub_newton_lambda * f for f in config.scrub_lambda_grid]
        nats = kl_over_lambda(
            scrub_o.mean,
            scrub_o.base_covariance(),
            scrub_r.mean,
            scrub_r.base_covariance(),
            lams,
            config.scrub_sigma_h,
        )
        for lam, kl in zip(lams, nats, strict=True):
            # the table's draw at the configured lambda: same seed, same noise direction
            rng = np.random.default_rng(derive_seed(config.seed, "scrub", "newton"))
            sample = with_head(models["original"], scrub_o.sample(lam, config.scrub_sigma_h, rng))
            rows.append(
                _tradeoff_row("newton", lam, kl, errors(sample), "head only, given the body")
            )
        log(f"information bound (newton, head): {', '.join(f'{v:.3g}' for v in nats)} nats")
    if fishers:
        fishers["retrain"] = _fisher(stats, retrained, keepers, config)
        for kind in FISHER_VARIANTS:
            if kind not in models:
                continue
            lams = [fisher_lambda(config, kind) * f for f in config.scrub_lambda_grid]
            gaussian = {
                which: _fisher_gaussian(kind, models[which], fishers[which], config, forget)
                for which in ("original", "retrain")
            }
            flat = {
                which: [np.concatenate([v.ravel() for v in part.values()]) for part in pair]
                for which, pair in gaussian.items()
            }
            nats = kl_over_lambda(
                flat["original"][0],
                flat["original"][1],
                flat["retrain"][0],
                flat["retrain"][1],
                lams,
                config.scrub_sigma_h,
            )
            for lam, kl in zip(lams, nats, strict=True):
                sample = _fisher_sample(
                    *gaussian["original"], lam, config, kind, models["original"]
                )
                rows.append(_tradeoff_row(kind, lam, kl, errors(sample), "whole network"))
            log(f"information bound ({kind}): {', '.join(f'{v:.3g}' for v in nats)} nats")
    return pd.DataFrame(rows)


def _tradeoff_row(method, lam, nats, errors: Mapping[str, float], scope) -> dict:
    return {"method": method, "lam": lam, "information_nats": float(nats), **errors, "scope": scope}


def _readouts(outcome, data, models, seconds, tradeoff, log) -> tuple[pd.DataFrame, dict]:
    config = outcome.config
    device = resolve_device(config.device)
    x_d, y_d = data["D"]
    x_f, y_f = data["D_f"]
    rng = np.random.default_rng(derive_seed(config.seed, "entropy"))
    subsets = {
        name: torch.as_tensor(
            np.sort(
                rng.choice(
                    len(data[name][0]), min(ENTROPY_SAMPLES, len(data[name][0])), replace=False
                )
            )
        )
        for name in ("D_r", "D_f", "D_test")
    }
    rows, entropies = [], {}
    lam_of = {
        "newton": config.scrub_newton_lambda,
        "newton-forget-only": config.scrub_newton_lambda,
        "newton-finite": config.scrub_newton_lambda,
        **{kind: fisher_lambda(config, kind) for kind in FISHER_VARIANTS},
    }
    for method, state in models.items():
        model = outcome.new_model()
        model.load_state_dict(state)
        row = {"method": method}
        for name in data:
            if name != "D":
                row[f"error_{name[2:]}"] = error_rate(model, *data[name], device=device)
        relearn = relearn_time(
            model,
            x_d,
            y_d,
            x_f,
            y_f,
            threshold=config.scrub_relearn_threshold,
            lr=config.lr,
            momentum=config.momentum,
            batch_size=config.batch_size,
            max_epochs=config.scrub_relearn_epochs,
            check_every=relearn_check_every(len(x_d), config.batch_size),
            seed=derive_seed(config.seed, "relearn"),
            device=device,
        )
        row["relearn_epochs"] = relearn.epochs if relearn.reached else float("nan")
        row["relearn_reached"] = relearn.reached
        row["relearn_budget_epochs"] = relearn.budget_epochs
        row["forget_loss_start"] = relearn.curve[0][1]
        row["lam"] = lam_of.get(method, float("nan"))
        match = tradeoff[(tradeoff["method"] == method)] if not tradeoff.empty else tradeoff
        if method in lam_of and not match.empty:
            at = match[np.isclose(match["lam"], row["lam"])]
            row["information_nats"] = (
                float(at["information_nats"].iloc[0]) if not at.empty else float("nan")
            )
        else:
            row["information_nats"] = float("nan")
        row["seconds"] = seconds.get(method, float("nan"))
        rows.append(row)
        entropies[method] = {
            name: output_entropy(model, data[name][0][subsets[name]], device=device)
            for name in subsets
        }
        log(f"readouts {method}: error D_f {row['error_f']:.3f}, relearn {row['relearn_epochs']}")
    table = pd.DataFrame(rows)
    reference = table.set_index("method").loc["retrain"]
    for column in ("error_f", "relearn_epochs"):
        table[f"{column}_gap_to_retrain"] = (table[column] - reference[column]).abs()
    return table, entropies
