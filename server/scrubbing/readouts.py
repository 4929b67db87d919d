"""The scrubbing phase's readouts (Golatkar et al., Section 5.3): error on D_test, D_f and D_r;
relearn time; output-entropy histograms; and the information bound (Proposition 2) between the
scrubbed original and the scrubbed retrained model over a lambda grid, with the error it costs (the
paper's Fig. 2). The readouts use the clients' data, which the server rebuilds from the run config
in a simulation (measurement only: no method reads it).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import torch

from fedunlearn.certified.curvature import assemble_hessian, head_matrix, with_head
from fedunlearn.data.forget_sets import ForgetSet
from fedunlearn.registry import SCRUBBING
from fedunlearn.scrubbing.readouts import error_rate, output_entropy, relearn_time
from fedunlearn.scrubbing.scrubbers import NewtonScrubber, kl_over_lambda
from fedunlearn.seeding import derive_seed
from fedunlearn.training.local import resolve_device
from fedunlearn.training.model_state import State
from server.scrubbing.methods import (
    ScrubContext,
    fisher_gaussian_of,
    fisher_state,
    mean_fisher,
    method_lambda,
)
from server.training.rounds import TrainingOutcome

#: Samples per split for the entropy histograms.
ENTROPY_SAMPLES = 2000


def relearn_check_every(samples: int, batch_size: int) -> int:
    """Steps between D_f-loss checks in the relearn readout: 1/400 of an epoch (relearning a
    forgotten MNIST class takes well under a tenth of an epoch), at least every step."""
    return max(1, -(-samples // batch_size) // 400)


def readout_data(outcome: TrainingOutcome, masks, forget: ForgetSet) -> dict:
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


def information_tradeoff(
    context: ScrubContext, data: dict, models: Mapping[str, State]
) -> pd.DataFrame:
    """Proposition 2's bound in nats and the errors, over ``lambda * scrub-lambda-factors``: the
    Newton scrub of the head (given the body) and every Fisher scrub of the whole network."""
    config = context.config
    device = resolve_device(config.device)
    model = context.outcome.new_model()

    def errors(state: State) -> dict[str, float]:
        model.load_state_dict(state)
        names = {"D_f": "error_forget", "D_test": "error_test", "D_test_other": "error_test_other"}
        return {
            column: error_rate(model, *data[name], device=device)
            for name, column in names.items()
            if name in data
        }

    rows = []
    if "newton" in context.scrubbers:
        rows += _newton_tradeoff(context, models, errors)
    if context.fishers:
        context.fishers["retrain"] = mean_fisher(context, models["retrain"])
        for spec in SCRUBBING:
            if "fisher-statistics" in spec.needs and spec.name in models:
                rows += _fisher_tradeoff(context, spec.name, models, errors)
    return pd.DataFrame(rows)


def _newton_tradeoff(context: ScrubContext, models, errors) -> list[dict]:
    """The bound between the Newton scrubs of the original and of the retrained head."""
    config = context.config
    retrained = models["retrain"]
    head = context.stats.ask("head", retrained, ("retained",), context.keepers, hessian=True)
    head = head["retained"]
    w_r = head_matrix(retrained)
    k, d = w_r.shape
    n_r = head["count"]
    curvature = assemble_hessian(head["blocks"], k, d) / n_r + config.scrub_damping * np.eye(k * d)
    scrub_r = NewtonScrubber(w_r, head["gradient"] / n_r, curvature)
    scrub_o = context.scrubbers["newton"]
    lams = [method_lambda(config, "newton") * f for f in config.scrub_lambda_grid]
    nats = kl_over_lambda(
        scrub_o.mean,
        scrub_o.base_covariance(),
        scrub_r.mean,
        scrub_r.base_covariance(),
        lams,
        config.scrub_sigma_h,
    )
    rows = []
    for lam, kl in zip(lams, nats, strict=True):
        # the table's draw at the configured lambda: same seed, same noise direction
        rng = np.random.default_rng(derive_seed(config.seed, "scrub", "newton"))
        sample = with_head(models["original"], scrub_o.sample(lam, config.scrub_sigma_h, rng))
        rows.append(_tradeoff_row("newton", lam, kl, errors(sample), "head only, given the body"))
    context.log(f"information bound (newton, head): {', '.join(f'{v:.3g}' for v in nats)} nats")
    return rows


def _fisher_tradeoff(context: ScrubContext, name: str, models, errors) -> list[dict]:
    """The bound between the Fisher scrub ``name`` of the original and of the retrained model."""
    config = context.config
    lams = [method_lambda(config, name) * f for f in config.scrub_lambda_grid]
    gaussian = {
        which: fisher_gaussian_of(
            name, models[which], context.fishers[which], config, context.forget
        )
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
    rows = []
    for lam, kl in zip(lams, nats, strict=True):
        sample = fisher_state(*gaussian["original"], lam, config, name, models["original"])
        rows.append(_tradeoff_row(name, lam, kl, errors(sample), "whole network"))
    context.log(f"information bound ({name}): {', '.join(f'{v:.3g}' for v in nats)} nats")
    return rows


def _tradeoff_row(method, lam, nats, errors: Mapping[str, float], scope) -> dict:
    return {"method": method, "lam": lam, "information_nats": float(nats), **errors, "scope": scope}


def readouts(
    outcome: TrainingOutcome, data: dict, models, seconds, tradeoff: pd.DataFrame, log
) -> tuple[pd.DataFrame, dict]:
    """The readout table (one row per model; gaps to FedRetrain) and the entropy histograms."""
    config = outcome.config
    device = resolve_device(config.device)
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
    for method, state in models.items():
        model = outcome.new_model()
        model.load_state_dict(state)
        row = _readout_row(outcome, data, method, model, tradeoff, device)
        row["seconds"] = seconds.get(method, float("nan"))
        rows.append(row)
        entropies[method] = {
            name: output_entropy(model, data[name][0][subsets[name]], device=device)
            for name in subsets
        }
        relearn = row["relearn_epochs"]
        relearned = f"{relearn:.4g} epochs" if relearn == relearn else "not within the budget"
        log(f"readouts {method}: error D_f {row['error_f']:.3f}, relearn {relearned}")
    table = pd.DataFrame(rows)
    reference = table.set_index("method").loc["retrain"]
    for column in ("error_f", "relearn_epochs"):
        table[f"{column}_gap_to_retrain"] = (table[column] - reference[column]).abs()
    return table, entropies


def _readout_row(outcome: TrainingOutcome, data: dict, method, model, tradeoff, device) -> dict:
    """Errors, relearn time and (for a noisy scrub) lambda and the bound at it, of one model."""
    config = outcome.config
    x_d, y_d = data["D"]
    x_f, y_f = data["D_f"]
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
    row["lam"] = method_lambda(config, method)
    row["information_nats"] = float("nan")
    match = tradeoff[(tradeoff["method"] == method)] if not tradeoff.empty else tradeoff
    if not np.isnan(row["lam"]) and not match.empty:
        at = match[np.isclose(match["lam"], row["lam"])]
        if not at.empty:
            row["information_nats"] = float(at["information_nats"].iloc[0])
    return row
