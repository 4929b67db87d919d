"""Recovery methods on Flower: FedRecover, Crab and SIFU read what the training run retained for
them (:mod:`server.retention_plan`) and ask the remaining clients for exact updates when their
algorithm calls for one; the math is Flower-free in :mod:`fedunlearn.unlearning`.

An exact update is a ``train`` message with the run's ``local-epochs`` and ``server-round`` = the
original round, so the client trains with that round's batch order (:class:`ClientUpdates`); the
forgotten clients' nodes are never addressed. Each method's client-epochs and traffic are metered
at the grid (:mod:`server.metering`).
"""

from __future__ import annotations

from functools import partial

from fedunlearn.certified.removal import utc_timestamp
from fedunlearn.errors import ConfigError
from fedunlearn.preflight import UNLEARNING_LOG
from fedunlearn.store.durable_io import append_jsonl
from fedunlearn.training.model_state import state_sha256
from fedunlearn.training.stacked import member_groups
from fedunlearn.unlearning.crab import CrabSelector, crab_recover
from fedunlearn.unlearning.fedrecover import FedRecoverSchedule
from fedunlearn.unlearning.fedrecover import fedrecover as recover
from fedunlearn.unlearning.gaussian_mechanism import add_noise, entropy_generator
from fedunlearn.unlearning.sifu import (
    SensitivityAccumulator,
    SensitivityRetention,
    SifuCertificate,
)
from server.federated_training import fedavg_rounds, participant_strategy, train_config_record
from server.queries import collect_replies
from strategies.client_updates import ClientUpdates
from strategies.retaining_fedavg import STATE_KEY


def exact_updates(context, phase: str) -> ClientUpdates:
    """The run's exact-update request (E_loc epochs from the model sent, ``train`` messages),
    forbidden to address the context's excluded clients."""
    outcome, config = context.outcome, context.outcome.config
    requests = ClientUpdates(
        partial(collect_replies, context.grid, timeout=config.reply_timeout, log=context.log),
        outcome.members.node_of_partition,
        message_type="train",
        epochs=config.local_epochs,
        train_config={k: v for k, v in train_config_record(config).items() if k != "local-epochs"},
        phase=phase,
        screen=outcome.screen.training if outcome.screen is not None else None,
        is_dropped=lambda partition: partition in outcome.members.dropped,
    )
    requests.forbid(context.excluded)
    return requests


def fedrecover_schedule(config) -> FedRecoverSchedule:
    """T_w, T_c, T_f, s and the abnormality threshold of the run config (0: derived, eq. 12)."""
    threshold = config.fedrecover_threshold
    return FedRecoverSchedule(
        warmup_rounds=config.fedrecover_warmup,
        correction_period=config.fedrecover_correction_period,
        final_tuning_rounds=config.fedrecover_final_tuning,
        buffer_size=config.fedrecover_buffer,
        abnormality_threshold=None if threshold == 0 else threshold,
        tolerance_rate=config.fedrecover_tolerance,
    )


def fedrecover(context, name: str):
    """FedRecover (Cao et al. 2023, Algorithm 2): retraining without the excluded clients with
    their remaining clients' updates estimated by L-BFGS from every round's history."""
    history = context.history(name, "round-history")
    requests = exact_updates(context, name)
    log = context.log

    def progress(step):
        if step.exact or step.fixed:
            log(
                f"{name}: round {step.round}, {len(step.exact)} exact update(s)"
                + (f", abnormality fixed for {step.fixed}" if step.fixed else "")
            )

    result = recover(
        history,
        context.excluded,
        requests,
        fedrecover_schedule(context.outcome.config),
        groups=member_groups(history.read_global(history.rounds()[0])),
        progress=progress,
    )
    return result.model, {
        "rounds": len(result.steps),
        "exact_rounds": result.exact_rounds,
        "exact_client_rounds": result.exact_client_rounds,
        "abnormality_fixed": {str(r): c for r, c in result.fixed.items()},
    }


def crab_policy(config) -> CrabSelector:
    """Crab's selective storage with the run's P, X, alpha and window."""
    return CrabSelector(
        round_ratio=config.crab_round_ratio,
        client_ratio=config.crab_client_ratio,
        loss_drop=config.crab_loss_drop,
        window=config.crab_window,
    )


def _policy_state(store, need: str, method: str) -> dict:
    """The state the training run's policy for ``need`` saved after its last round."""
    states = store.metadata.get(STATE_KEY, {})
    last = max((int(r) for r in states), default=None)
    state = states[str(last)].get(need) if last is not None else None
    if state is None:
        raise ConfigError(
            "unlearn-methods", method, f"a run trained with {method} among its methods"
        )
    return state


def crab(context, name: str):
    """Crab (Jiang et al. 2025): adaptive rollback to the latest kept round the removed clients had
    not significantly affected, then update renewal and calibration over the kept rounds after it."""
    history = context.history(name, "selected-history")
    state = _policy_state(context.outcome.store, "selected-history", name)
    log = context.log

    def progress(step):
        log(f"{name}: round {step.round}, {len(step.clients)} client(s)")

    result = crab_recover(
        history,
        context.excluded,
        exact_updates(context, name),
        sensitivity_bound=context.outcome.config.crab_sensitivity_bound,
        influence=state["influence"],
        groups=member_groups(history.read_global(history.rounds()[0])),
        progress=progress,
    )
    log(f"{name}: rolled back to round {result.rollback_round}")
    return result.model, {
        "rollback_round": result.rollback_round,
        "exact_client_rounds": result.exact_client_rounds,
        "kept_rounds": history.rounds(),
    }


def forget_crab_state(state, clients) -> dict:
    """Crab's saved selection without ``clients``' recorded contribution norms."""
    state = dict(state)
    state["influence"] = {
        t: {
            **record,
            "clients": {c: v for c, v in record["clients"].items() if int(c) not in clients},
        }
        for t, record in state["influence"].items()
    }
    state["kept"] = {t: [c for c in kept if c not in clients] for t, kept in state["kept"].items()}
    return state


def sifu_policy(config) -> SensitivityRetention:
    """SIFU's retention: every round's global model and the accumulated bounds Psi(n, i) under
    the run's client SGD (lr, momentum, weight decay, E_loc epochs of ceil(N_k / B) steps) and the
    assumed smoothness L (``sifu-smoothness``), or non-expansive local work (``sifu-expansion``)."""
    return SensitivityRetention(
        SensitivityAccumulator(
            learning_rate=config.lr,
            smoothness=config.sifu_smoothness,
            local_epochs=config.local_epochs,
            batch_size=config.batch_size,
            momentum=config.momentum,
            weight_decay=config.weight_decay,
            expansion=config.sifu_expansion,
        )
    )


def forget_sifu_state(state, clients) -> dict:
    """A saved accumulator with ``clients`` folded into the anonymous forgotten cohort."""
    accumulator = SensitivityAccumulator.from_json(state)
    accumulator.forget(clients)
    return accumulator.to_json()


def sifu(context, name: str):
    """SIFU (Fraboni et al. 2024): roll back to the last round T whose sensitivity bound for the
    excluded clients is within the budget Psi* = epsilon sigma / c, add N(0, sigma^2) noise drawn
    from OS entropy, and retrain FedAvg from T without them; the certificate goes to the run's
    ledger (``certified_removal.jsonl``, ``"method": "sifu"``)."""
    outcome, config, log = context.outcome, context.outcome.config, context.log
    history = context.history(name, "sensitivity-bounds")
    accumulator = SensitivityAccumulator.from_json(
        _policy_state(outcome.store, "sensitivity-bounds", name)
    )
    last = history.rounds()[-1]
    certificate = SifuCertificate.issue(
        accumulator,
        context.excluded,
        request=len(outcome.run.read_log(UNLEARNING_LOG)) + 1,
        n_after=len(context.remaining_nodes),
        epsilon=config.sifu_epsilon,
        delta=config.sifu_delta,
        sigma=config.sifu_sigma,
        mechanism=config.sifu_mechanism,
        latest=last + 1,
    )
    rollback = certificate.rollback_round
    start = outcome.final_state if rollback == last + 1 else history.read_global(rollback)
    noisy = add_noise(start, certificate.sigma, entropy_generator())
    log(
        f"{name}: rollback to round {rollback} of {last + 1} (bound {certificate.beta_after:.3g} "
        f"<= budget {certificate.budget:.3g}), noise sigma {certificate.sigma:g}"
    )
    model = outcome.new_model()
    model.load_state_dict(noisy)
    state = fedavg_rounds(
        context.grid,
        participant_strategy(context.remaining_nodes),
        model,
        config,
        first_round=rollback,
        screen=outcome.screen,
        phase=name,
        log=log,
    )
    record = {
        **certificate.to_record(),
        "method": "sifu",
        "timestamp": utc_timestamp(),
        "weights_sha256": state_sha256(state),
    }
    append_jsonl(outcome.run.path / "certified_removal.jsonl", record)
    return state, {
        "rollback_round": rollback,
        "retrained_rounds": config.rounds - rollback + 1,
        "budget": certificate.budget,
        "bound": certificate.beta_after,
        "certified": certificate.certified,
    }
