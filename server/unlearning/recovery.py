"""Recovery methods on Flower: FedRecover, Crab and SIFU read what the training run retained for
them (their retention policies, :mod:`fedunlearn.store.history`) and ask the remaining clients for exact updates when their
algorithm calls for one; the math is Flower-free in :mod:`fedunlearn.unlearning`.

An exact update is a ``train`` message with the run's ``local-epochs`` and ``server-round`` = the
original round, so the client trains with that round's batch order (:class:`ClientUpdates`); the
forgotten clients' nodes are never addressed. Each method's client-epochs and traffic are metered
at the grid (:mod:`server.federation.metering`).
"""

from __future__ import annotations

from fedunlearn.certified.certificate import utc_timestamp
from fedunlearn.errors import ConfigError
from fedunlearn.store.history import load_policy
from fedunlearn.store.json_lines import append_jsonl
from fedunlearn.store.run_directory import CERTIFIED_LEDGER, UNLEARNING_LOG
from fedunlearn.training.local import evaluate, resolve_device
from fedunlearn.training.model_state import state_sha256
from fedunlearn.training.stacked import member_groups
from fedunlearn.unlearning.crab import CrabSelector
from fedunlearn.unlearning.crab_recovery import crab_recover
from fedunlearn.unlearning.divergence_guard import DivergenceGuard
from fedunlearn.unlearning.fedrecover import GUARDED, FedRecoverSchedule
from fedunlearn.unlearning.fedrecover import fedrecover as recover
from fedunlearn.unlearning.gaussian_mechanism import add_noise, entropy_generator
from fedunlearn.unlearning.sifu import SensitivityRetention, SifuCertificate
from server.federation.members import round_sampler
from server.training.rounds import fedavg_rounds, participant_strategy
from server.unlearning.participation import client_requests
from strategies.client_updates import ClientUpdates


def exact_updates(context, phase: str) -> ClientUpdates:
    """The run's exact-update request (E_loc epochs from the model sent, ``train`` messages),
    forbidden to address the context's excluded clients."""
    return client_requests(context, phase)


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


def fedrecover_guard(config) -> DivergenceGuard | None:
    """The divergence guard of the run config (ours; None: the paper's FedRecover)."""
    return DivergenceGuard(slack=config.fedrecover_guard_slack) if config.fedrecover_guard else None


def server_loss(outcome):
    """The server-side loss of a model state on the run's evaluation split (what the guard
    watches), or None for a judge run's stack (the guard then watches the steps only)."""
    if outcome.config.stack_members:
        return None
    device = resolve_device(outcome.config.device)
    model, test = outcome.new_model().to(device), outcome.data.splits.test

    def loss(state) -> float:
        model.load_state_dict(state)
        return evaluate(model, test.x, test.y, device=device).loss

    return loss


def _fedrecover_progress(log, name: str, node_of_partition=None):
    nodes = node_of_partition or {}

    def progress(step):
        if step.missing:
            named = ", ".join(f"{k} (node {nodes.get(k, '?')})" for k in step.missing)
            log(
                f"{name}: round {step.round}, no usable exact update from client(s) {named}: "
                "estimated where its history allows, else left out of the round"
            )
        if step.kind == GUARDED:
            log(
                f"{name}: round {step.round} estimated, then redone with {len(step.clients)} exact "
                f"update(s) by the guard: {step.reason}"
            )
        elif step.exact or step.fixed:
            log(
                f"{name}: round {step.round}, {len(step.exact)} exact update(s)"
                + (f", abnormality fixed for {step.fixed}" if step.fixed else "")
            )
        if step.refused:
            log(
                f"{name}: round {step.round}, the guard refused the exact replies of {step.refused}"
            )

    return progress


def fedrecover(context, name: str):
    """FedRecover (Cao et al. 2023, Algorithm 2): retraining without the excluded clients with
    their remaining clients' updates estimated by L-BFGS from every round's history, under the
    run's divergence guard (ours, ``fedrecover-guard``)."""
    history = context.history(name)
    config = context.outcome.config
    guard = fedrecover_guard(config)
    result = recover(
        history,
        context.excluded,
        exact_updates(context, name),
        fedrecover_schedule(config),
        groups=member_groups(history.read_global(history.rounds()[0])),
        guard=guard,
        loss=server_loss(context.outcome) if guard is not None else None,
        progress=_fedrecover_progress(context.log, name, context.outcome.members.node_of_partition),
        min_reply_fraction=config.min_reply_fraction,
    )
    estimated = [t for t in result.estimated_rounds if t not in result.guarded]
    fixes = sum(len(clients) for clients in result.fixed.values())
    missing = sum(len(clients) for clients in result.missing.values())
    did = (
        f"{len(estimated)} round(s) estimated ({fixes} abnormality fix(es)), "
        f"{len(result.exact_rounds)} exact, {len(result.guarded)} redone by the guard"
        + (f", {missing} exact update(s) missing (estimated or left out)" if missing else "")
        + ("" if guard is not None else " (guard off: the paper's FedRecover)")
    )
    context.log(f"{name}: {did}")
    return result.model, {
        "did": did,
        "rounds": len(result.steps),
        "exact_rounds": result.exact_rounds,
        "estimated_rounds": estimated,
        "guarded_rounds": {str(r): why for r, why in result.guarded.items()},
        "guard": guard is not None,
        "exact_client_rounds": result.exact_client_rounds,
        "abnormality_fixed": {str(r): c for r, c in result.fixed.items()},
        "refused_replies": {str(r): c for r, c in result.refused.items()},
        "missing_exact_updates": {str(r): c for r, c in result.missing.items()},
        "thresholds": result.thresholds,
    }


def crab(context, name: str):
    """Crab (Jiang et al. 2025): roll back to the first kept round (``crab-rollback =
    first-kept``, the authors') or to the latest kept round before the removed clients' share of a
    global step exceeded β (``sensitivity``, ours), then re-run the kept rounds after it: update
    renewal by the kept remaining clients, calibration to the stored step sizes, aggregation."""
    history = context.history(name)
    selector = load_policy(context.outcome.store, CrabSelector, method=name)
    if selector.open_rounds:
        raise ConfigError(
            "unlearn-methods",
            name,
            f"a run whose training finished: rounds {selector.open_rounds} of Crab's last "
            "window were never chosen among",
        )
    config, log = context.outcome.config, context.log

    def progress(step):
        kind = "re-ran" if step.renewed else "stored updates of"
        log(f"{name}: {kind} round {step.round}, {len(step.clients)} client(s)")

    result = crab_recover(
        history,
        context.excluded,
        exact_updates(context, name),
        rollback=config.crab_rollback,
        sensitivity_bound=config.crab_sensitivity_bound,
        influence=selector.influence,
        groups=member_groups(history.read_global(history.rounds()[0])),
        progress=progress,
    )
    rule = "authors" if result.rule == "first-kept" else result.rule
    did = (
        f"rolled back to round {result.rollback_round} ({rule} rule), re-ran rounds "
        f"{_rounds(result.rerun_rounds)} of the kept {_rounds(history.rounds())}"
    )
    log(f"{name}: {did}")
    return result.model, {
        "did": did,
        "rule": rule,
        "rollback_round": result.rollback_round,
        "rollback_rounds": result.rollback_rounds,
        "rerun_rounds": result.rerun_rounds,
        "kept_rounds": history.rounds(),
        "exact_client_rounds": result.exact_client_rounds,
    }


def _rounds(rounds) -> str:
    """``[1, 2, 3, 5]`` as ``1-3, 5``: a table cell, not a list of twenty numbers."""
    rounds, spans = sorted(rounds), []
    for t in rounds:
        if spans and t == spans[-1][1] + 1:
            spans[-1][1] = t
        else:
            spans.append([t, t])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)
    return f"[{text}]"


def sifu(context, name: str):
    """SIFU (Fraboni et al. 2024): roll back to the last round T whose sensitivity bound for the
    excluded clients is within the budget Psi* = epsilon sigma / c, add N(0, sigma^2) noise drawn
    from OS entropy, and retrain FedAvg from T without them; the certificate goes to the run's
    ledger (``certified_removal.jsonl``, ``"method": "sifu"``)."""
    outcome, config, log = context.outcome, context.outcome.config, context.log
    history = context.history(name)
    accumulator = load_policy(outcome.store, SensitivityRetention, method=name).accumulator
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
    # with fraction-train < 1 the retraining samples the remaining clients, its own stream
    sampler = round_sampler(outcome.members, config, name)
    state = fedavg_rounds(
        context.grid,
        participant_strategy(
            config,
            context.remaining_nodes,
            sampler=sampler,
            members=outcome.members,
            phase=name,
            log=log,
        ),
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
    append_jsonl(outcome.run.path / CERTIFIED_LEDGER, record)
    return state, {
        "did": (
            f"rolled back to round {rollback} of {last + 1}, noise sigma {certificate.sigma:g}, "
            f"retrained {config.rounds - rollback + 1} round(s)"
        ),
        "rollback_round": rollback,
        "retrained_rounds": config.rounds - rollback + 1,
        "budget": certificate.budget,
        "bound": certificate.beta_after,
        "certified": certificate.certified,
    }
