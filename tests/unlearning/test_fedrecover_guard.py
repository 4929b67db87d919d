"""FedRecover's abnormality threshold as the paper states it, and the divergence guard (ours):
hostile histories and hostile exact replies must not move the recovery off the retrained model.

The world is test_fedrecover's: least-squares clients whose exact updates are computable."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedunlearn.errors import ConfigError
from fedunlearn.store.update_store import UpdateStore
from fedunlearn.training.model_state import parameter_groups
from fedunlearn.unlearning.divergence_guard import DivergenceGuard, GuardRanges
from fedunlearn.unlearning.fedrecover import (
    FedRecoverSchedule,
    abnormality_thresholds,
    fedrecover,
    history_scales,
)
from tests.unlearning.test_fedrecover import (
    MALICIOUS,
    ROUNDS,
    SCHEDULE,
    _client_data,
    _Clients,
    _distance,
    _fedavg,
    _initial_model,
    _participants,
)

#: abnormality fixing off: what the guard alone does
UNFIXED = FedRecoverSchedule(
    warmup_rounds=4,
    correction_period=10,
    final_tuning_rounds=2,
    buffer_size=2,
    abnormality_threshold=math.inf,
)
ESTIMATED = [p for p in range(1, ROUNDS + 1) if not UNFIXED.is_exact(p, ROUNDS)]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    data = _client_data(seed=1)
    root = tmp_path_factory.mktemp("guard")
    store = UpdateStore(root / "store")
    original = _fedavg(_initial_model(), data, ROUNDS, _participants, store)
    honest = lambda t: [k for k in _participants(t) if k != MALICIOUS]  # noqa: E731
    retrained = _fedavg(store.read_global(1), data, ROUNDS, honest)
    return data, store, original, retrained, root


def _loss(data):
    """The server-side loss: least squares over the remaining clients' data."""

    def loss(state) -> float:
        w, b = state["weight"].double().reshape(-1), state["bias"].double()
        total = sum(float(((x @ w + b - y) ** 2).sum()) / 2 for x, y in _honest(data))
        return total / sum(len(y) for _, y in _honest(data))

    return loss


def _honest(data):
    return [data[k] for k in data if k != MALICIOUS]


def _flat_update(update) -> torch.Tensor:
    return torch.cat([v.reshape(-1).double() for v in update.values()])


def _history_extremes(store):
    updates = [
        store.read_update(t, k) for t in store.rounds() for k in store.clients(t) if k != MALICIOUS
    ]
    norm = max(float(_flat_update(u).norm()) for u in updates)
    coordinate = max(float(_flat_update(u).abs().max()) for u in updates)
    return norm, coordinate


def _hostile_store(path, store, t_planted, client, kind):
    """A copy of ``store`` whose ``client`` record of round ``t_planted`` is rewritten: one
    coordinate 100 times the history's largest (``huge``), or the update flipped and scaled to
    the history's largest norm (``flipped``)."""
    peak_norm, peak_coordinate = _history_extremes(store)
    hostile = UpdateStore(path)
    for t in store.rounds():
        updates = {}
        for k, n in store.num_examples(t).items():
            update = {key: v.clone() for key, v in store.read_update(t, k).items()}
            if (t, k) == (t_planted, client):
                if kind == "huge":
                    update["weight"][0, 2] = 100 * peak_coordinate
                else:
                    scale = peak_norm / float(_flat_update(update).norm())
                    update = {key: -scale * v for key, v in update.items()}
            updates[k] = (update, n)
        hostile.write_round(t, store.read_global(t), updates)
    return hostile


# ------------------------------------------------------------------ the paper's threshold
def test_tau_pools_the_coordinates_of_each_rounds_updates_and_takes_the_largest_round(tmp_path):
    store = UpdateStore(tmp_path / "store")
    zero = {"w": torch.zeros(4)}
    rounds = {
        1: {0: [0.1, -0.9, 0.2, 0.3], 1: [0.5, 0.4, -0.6, 0.05], 2: [9.0, 9.0, 9.0, 9.0]},
        2: {0: [1.0, 0.0, 0.0, 0.0], 1: [0.0, -2.0, 0.7, 0.0], 2: [9.0, 9.0, 9.0, 9.0]},
    }
    for t, clients in rounds.items():
        store.write_round(t, zero, {k: ({"w": torch.tensor(v)}, 1) for k, v in clients.items()})
    groups = parameter_groups(zero)
    # 8 pooled coordinates of clients 0 and 1 (client 2 is excluded): α = 0.25 lets ⌊2⌋ above τ_t
    # round 1: |values| sorted 0.9, 0.6, 0.5, ... -> τ_1 = 0.5; round 2: 2.0, 1.0, 0.7 -> τ_2 = 0.7
    assert abnormality_thresholds(store, [2], groups, 0.25) == [pytest.approx(0.7)]
    # α = 0: the largest coordinate of any round
    assert abnormality_thresholds(store, [2], groups, 0.0) == [pytest.approx(2.0)]
    scales = history_scales(store, [2], groups, 0.25)
    assert scales.peaks == [pytest.approx(math.sqrt(4 + 0.49))]  # client 1's round-2 norm


def test_at_most_alpha_of_a_rounds_coordinates_exceed_tau_t(world):
    _, store, _, _, _ = world
    groups = parameter_groups(store.read_global(1))
    for alpha in (0.01, 0.05, 0.2):
        tau = abnormality_thresholds(store, [MALICIOUS], groups, alpha)[0]
        worst = 0.0
        for t in store.rounds():
            pooled = torch.cat(
                [_flat_update(store.read_update(t, k)) for k in store.clients(t) if k != MALICIOUS]
            ).abs()
            assert int((pooled > tau).sum()) <= math.floor(alpha * pooled.numel())
            worst = max(worst, float(pooled.max()))
        assert tau <= worst


# ------------------------------------------------------------------ the guard's claims
@settings(
    max_examples=16, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    t=st.sampled_from(ESTIMATED),
    client=st.sampled_from([0, 1, 2]),
    kind=st.sampled_from(["huge", "flipped"]),
)
def test_a_hostile_history_is_redone_by_the_guard_and_the_recovery_stays_on_course(
    world, t, client, kind
):
    data, store, original, retrained, root = world
    if client not in store.clients(t):
        return
    path = root / f"hostile-{kind}-{t}-{client}"
    hostile = UpdateStore(path) if path.exists() else _hostile_store(path, store, t, client, kind)
    guarded = fedrecover(
        hostile, [MALICIOUS], _Clients(data), UNFIXED, guard=DivergenceGuard(), loss=_loss(data)
    )
    assert t in guarded.guarded, f"round {t} with a {kind} record of client {client} stood"
    assert guarded.steps[t - 1].kind == "guarded"
    assert sorted(guarded.steps[t - 1].exact) == sorted(guarded.steps[t - 1].clients)
    gap = _distance(original, retrained)
    assert _distance(guarded.model, retrained) < 0.01 * gap


def test_without_the_guard_a_hostile_history_steers_the_recovery_off(world):
    data, store, original, retrained, root = world
    hostile = _hostile_store(root / "unguarded", store, ESTIMATED[-3], 0, "huge")
    paper = fedrecover(hostile, [MALICIOUS], _Clients(data), UNFIXED)
    assert paper.guarded == {} and paper.estimated_rounds
    assert _distance(paper.model, retrained) > 0.5 * _distance(original, retrained)


def test_on_a_clean_history_the_guard_changes_nothing(world):
    data, store, _, _, _ = world
    paper = fedrecover(store, [MALICIOUS], _Clients(data), SCHEDULE)
    guarded = fedrecover(
        store, [MALICIOUS], _Clients(data), SCHEDULE, guard=DivergenceGuard(), loss=_loss(data)
    )
    assert guarded.guarded == {} and guarded.refused == {}
    assert guarded.exact_client_rounds == paper.exact_client_rounds
    for key in paper.model:
        assert torch.equal(guarded.model[key], paper.model[key])
    kinds = [step.kind for step in guarded.steps]
    assert kinds.count("estimated") == len(guarded.estimated_rounds) == len(ESTIMATED)


def test_the_paper_mode_never_evaluates_a_loss(world):
    data, store, _, _, _ = world

    def forbidden(state):
        raise AssertionError("the paper's FedRecover has no server-side loss")

    with pytest.raises(ConfigError, match="loss"):
        fedrecover(
            store,
            [MALICIOUS],
            _Clients(data),
            SCHEDULE,
            loss=forbidden,
            groups=[["weight"], ["bias"]],
            guard=DivergenceGuard(),
        )
    fedrecover(store, [MALICIOUS], _Clients(data), SCHEDULE, loss=forbidden)


class _HostileClient(_Clients):
    """Client 0 answers round ``t`` with its exact update times 1000."""

    def __init__(self, data, t):
        super().__init__(data)
        self.t = t

    def __call__(self, t, model, clients):
        out = super().__call__(t, model, clients)
        if t == self.t and 0 in out:
            out[0] = {k: 1e3 * v for k, v in out[0].items()}
        return out


def test_an_exact_reply_far_above_the_historys_norms_is_refused(world):
    data, store, original, retrained, _ = world
    hostile = _HostileClient(data, t=ROUNDS)  # final tuning: every client computes exactly
    guarded = fedrecover(
        store, [MALICIOUS], hostile, SCHEDULE, guard=DivergenceGuard(), loss=_loss(data)
    )
    assert guarded.refused == {ROUNDS: [0]}
    assert guarded.steps[-1].refused == [0]
    paper = fedrecover(store, [MALICIOUS], _HostileClient(data, t=ROUNDS), SCHEDULE)
    assert paper.refused == {}
    # left out of the last round, client 0 costs that round's share of its update; aggregated,
    # its reply would have thrown the model 1000 times its update away
    gap = _distance(original, retrained)
    assert _distance(guarded.model, retrained) < 0.1 * gap < _distance(paper.model, retrained)


# ------------------------------------------------------------------ the ranges themselves
def test_the_ranges_are_the_exact_rounds_with_slack():
    ranges = GuardRanges(DivergenceGuard(slack=0.5), history_peaks=[2.0])
    ranges.record_exact([1.0], 3.0, 1.0)
    ranges.record_exact([0.4], 1.0, 1.2)  # an exact round that raised the loss by 0.2
    assert ranges.step_problem([1.5]) is None
    assert "exceeds 1.5 x 1" in ranges.step_problem([1.51])
    assert "not finite" in ranges.step_problem([math.nan])
    # a rise of at most 0.2 + 0.5 * 1.0
    assert ranges.loss_problem(1.0, 1.7) is None
    assert "raised the server-side loss" in ranges.loss_problem(1.0, 1.71)
    assert "not finite" in ranges.loss_problem(1.0, math.inf)
    assert ranges.loss_problem(None, 5.0) is None
    assert ranges.reply_problem([3.0]) is None
    assert "exceeds 1.5 x 2" in ranges.reply_problem([3.01])
    assert ranges.reply_problem([math.nan]) is not None


def test_a_non_finite_exact_round_does_not_widen_the_range():
    ranges = GuardRanges(DivergenceGuard(slack=0.0), history_peaks=[1.0])
    ranges.record_exact([1.0], 1.0, 0.5)
    ranges.record_exact([math.inf], 0.5, math.nan)
    assert ranges.max_step == [1.0] and ranges.max_rise == -0.5


@pytest.mark.parametrize("slack", [-0.1, "lots", None, True])
def test_a_bad_slack_is_refused_naming_the_key(slack):
    with pytest.raises(ConfigError) as error:
        DivergenceGuard(slack=slack)
    assert error.value.parameter == "fedrecover-guard-slack"
