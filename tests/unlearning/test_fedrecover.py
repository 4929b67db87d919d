"""FedRecover (Cao et al., IEEE S&P 2023, Sec. IV) on a simulated FedAvg whose clients' exact updates
are computable: K clients doing full-batch gradient steps on least squares (updates affine in the
model, so the integrated Jacobian is constant and L-BFGS has something exact to find)."""

from __future__ import annotations

import importlib
import math

import pytest
import torch

from fedunlearn.errors import ConfigError
from fedunlearn.store.update_store import UpdateStore
from fedunlearn.training.model_state import parameter_groups
from fedunlearn.unlearning.fedrecover import (
    FedRecoverSchedule,
    abnormality_thresholds,
    fedrecover,
    tolerance_threshold,
)

# the module, not the function of the same name the package re-exports
fedrecover_module = importlib.import_module("fedunlearn.unlearning.fedrecover")

CLIENTS = (0, 1, 2, 3)
MALICIOUS = 3
ROUNDS = 40
LOCAL_STEPS, LR = 3, 0.3


def _client_data(seed: int, features: int = 6):
    """Each client's (X, y): its own feature scale and true weights; the malicious client's
    targets are flipped and scaled, so removing it moves the optimum far."""
    g = torch.Generator().manual_seed(seed)
    data = {}
    for k in CLIENTS:
        n = 20 + 5 * k
        x = torch.randn(n, features, generator=g, dtype=torch.float64) * (0.6 + 0.2 * k)
        w = torch.randn(features, generator=g, dtype=torch.float64)
        y = x @ w + 0.5 + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
        data[k] = (x, -8.0 * y if k == MALICIOUS else y)
    return data


def _local_update(state, x, y, prefix=""):
    """U = M_k − M after LOCAL_STEPS full-batch gradient steps on ½·mean((Xw + b − y)²)."""
    w = state[prefix + "weight"].double().reshape(-1).clone()
    b = state[prefix + "bias"].double().reshape(-1).clone()
    w0, b0 = w.clone(), b.clone()
    for _ in range(LOCAL_STEPS):
        residual = x @ w + b - y
        w, b = w - LR * x.T @ residual / len(y), b - LR * residual.mean()
    return {
        prefix + "weight": (w - w0).reshape(1, -1).float(),
        prefix + "bias": (b - b0).float(),
    }


def _participants(t: int) -> list[int]:
    """Client 2 sits out every 7th round: participation varies as under client sampling."""
    return [k for k in CLIENTS if not (k == 2 and t % 7 == 0)]


def _fedavg(model, data, rounds, clients_of, store=None):
    """FedAvg from ``model`` for ``rounds`` rounds; writes each round's M^t and U_k^t to ``store``."""
    model = {k: v.clone() for k, v in model.items()}
    for t in range(1, rounds + 1):
        clients = clients_of(t)
        updates = {k: _local_update(model, *data[k]) for k in clients}
        if store is not None:
            store.write_round(t, model, {k: (updates[k], len(data[k][1])) for k in clients})
        total = sum(len(data[k][1]) for k in clients)
        for key in model:
            step = sum(updates[k][key].double() * len(data[k][1]) for k in clients) / total
            model[key] = (model[key].double() + step).float()
    return model


def _initial_model(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return {"weight": torch.randn(1, 6, generator=g), "bias": torch.zeros(1)}


class _Clients:
    """The remaining clients: exact updates on request, every request recorded."""

    def __init__(self, data, prefixes=("",)):
        self.data, self.prefixes, self.calls = data, prefixes, []

    def __call__(self, t, model, clients):
        self.calls.append((t, list(clients)))
        out = {}
        for k in clients:
            update = {}
            for prefix in self.prefixes:
                update.update(_local_update(model, *self.data[k], prefix=prefix))
            out[k] = update
        return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    data = _client_data(seed=1)
    store = UpdateStore(tmp_path_factory.mktemp("fedrecover") / "store")
    original = _fedavg(_initial_model(), data, ROUNDS, _participants, store)
    honest = lambda t: [k for k in _participants(t) if k != MALICIOUS]  # noqa: E731
    retrained = _fedavg(store.read_global(1), data, ROUNDS, honest)
    return data, store, original, retrained


def _distance(a, b) -> float:
    return math.sqrt(sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in a))


SCHEDULE = FedRecoverSchedule(
    warmup_rounds=4, correction_period=10, final_tuning_rounds=2, buffer_size=2
)


# ------------------------------------------------------------------------------ the schedule
def test_the_exact_rounds_are_warm_up_every_t_c_after_it_and_final_tuning():
    exact = [p for p in range(1, 41) if SCHEDULE.is_exact(p, 40)]
    assert exact == [1, 2, 3, 4, 14, 24, 34, 39, 40]


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"warmup_rounds": 0}, "fedrecover-warmup"),
        ({"warmup_rounds": 2, "buffer_size": 2}, "fedrecover-warmup"),
        ({"warmup_rounds": 2.5}, "fedrecover-warmup"),
        ({"correction_period": 0}, "fedrecover-correction-period"),
        ({"correction_period": True}, "fedrecover-correction-period"),
        ({"final_tuning_rounds": -1}, "fedrecover-final-tuning"),
        ({"buffer_size": 0}, "fedrecover-buffer"),
        ({"abnormality_threshold": 0.0}, "fedrecover-threshold"),
        ({"abnormality_threshold": -1.0}, "fedrecover-threshold"),
        ({"abnormality_threshold": float("nan")}, "fedrecover-threshold"),
        ({"abnormality_threshold": "1"}, "fedrecover-threshold"),
        ({"tolerance_rate": 1.0}, "fedrecover-tolerance"),
        ({"tolerance_rate": -0.1}, "fedrecover-tolerance"),
    ],
)
def test_bad_schedules_are_refused_naming_the_key(kwargs, key):
    with pytest.raises(ConfigError) as error:
        FedRecoverSchedule(**kwargs)
    assert error.value.parameter == key


def test_infinite_threshold_turns_abnormality_fixing_off():
    assert FedRecoverSchedule(abnormality_threshold=math.inf).abnormality_threshold == math.inf


def test_the_tolerance_threshold_lets_at_most_alpha_of_the_values_above_it():
    values = -torch.arange(1.0, 101.0)  # |values| 1..100; signs do not matter
    tau = tolerance_threshold(values, 0.05)
    assert tau == 95.0
    assert int((values.abs() > tau).sum()) == 5
    assert int((values.abs() > tau - 0.5).sum()) == 6  # the smallest such τ
    assert tolerance_threshold(values, 0.0) == 100.0


# ------------------------------------------------------------------------ the paper's claims
def test_with_every_round_exact_fedrecover_is_retraining_without_the_client(world):
    data, store, _, retrained = world
    every_round = FedRecoverSchedule(warmup_rounds=ROUNDS, buffer_size=1)
    result = fedrecover(store, [MALICIOUS], _Clients(data), every_round)
    assert result.exact_rounds == list(range(1, ROUNDS + 1))
    for key in retrained:
        assert torch.allclose(result.model[key], retrained[key], rtol=1e-5, atol=1e-6)


def test_estimated_rounds_recover_the_retrained_model_at_a_fraction_of_the_client_cost(world):
    data, store, original, retrained = world
    clients = _Clients(data)
    result = fedrecover(store, [MALICIOUS], clients, SCHEDULE)
    retraining_cost = sum(len(_participants(t)) - 1 for t in range(1, ROUNDS + 1))
    assert result.exact_client_rounds <= retraining_cost / 3
    assert result.exact_client_rounds == sum(len(c) for _, c in clients.calls)
    gap = _distance(original, retrained)  # what the removed client did to the model
    # not 0: two pairs of non-conjugate steps do not pin the Jacobian down (see test_lbfgs)
    assert _distance(result.model, retrained) < 5e-3 * gap


def test_without_the_l_bfgs_correction_the_same_schedule_stays_far_from_retraining(
    world, monkeypatch
):
    """The claim above is L-BFGS's doing: the same schedule with every estimate left at the
    stored update (no Hessian-vector correction) ends far from the retrained model."""
    data, store, original, retrained = world
    corrected = fedrecover(store, [MALICIOUS], _Clients(data), SCHEDULE)
    monkeypatch.setattr(fedrecover_module, "lbfgs_hvp", lambda s, y, v: torch.zeros_like(v))
    uncorrected = fedrecover(store, [MALICIOUS], _Clients(data), SCHEDULE)
    assert _distance(uncorrected.model, retrained) > 0.5 * _distance(original, retrained)
    assert _distance(corrected.model, retrained) < 0.01 * _distance(uncorrected.model, retrained)


class _SpyHistory:
    """The store's read API, refusing any read of a removed client's update."""

    def __init__(self, store, excluded):
        self.store, self.excluded, self.reads = store, set(excluded), []

    def rounds(self):
        return self.store.rounds()

    def clients(self, t):
        return self.store.clients(t)

    def num_examples(self, t):
        return self.store.num_examples(t)

    def read_global(self, t):
        return self.store.read_global(t)

    def read_update(self, t, client):
        if client in self.excluded:
            raise AssertionError(f"read the removed client {client}'s update of round {t}")
        self.reads.append((t, client))
        return self.store.read_update(t, client)


def test_removed_clients_are_never_asked_nor_read(world):
    data, store, _, _ = world
    spy, clients = _SpyHistory(store, [MALICIOUS, 1]), _Clients(data)
    result = fedrecover(spy, [MALICIOUS, 1], clients, SCHEDULE)  # τ derived: reads all rounds
    assert clients.calls and all(MALICIOUS not in c and 1 not in c for _, c in clients.calls)
    assert {k for _, k in spy.reads} == {0, 2}
    assert all(set(step.clients) <= {0, 2} for step in result.steps)


def test_an_answer_from_a_removed_client_is_refused(world):
    data, store, _, _ = world
    leaky = lambda t, model, who: {**_Clients(data)(t, model, who), MALICIOUS: {}}  # noqa: E731
    with pytest.raises(RuntimeError, match="removed clients \\[3\\]"):
        fedrecover(store, [MALICIOUS], leaky, SCHEDULE)


def _silent(data, who_is_silent):
    """Clients whose exact update never comes (refused by the screen, or no reply) when
    ``who_is_silent(t, k)``; every request recorded."""
    clients = _Clients(data)

    def exact(t, model, who):
        return {k: v for k, v in clients(t, model, who).items() if not who_is_silent(t, k)}

    return exact, clients


def test_by_default_a_missing_exact_update_stops_the_recovery_naming_the_client(world):
    data, store, _, _ = world
    exact, _ = _silent(data, lambda t, k: k == 0)
    with pytest.raises(fedrecover_module.NotEnoughReplies, match="none from clients \\[0\\]"):
        fedrecover(store, [MALICIOUS], exact, SCHEDULE)


def test_a_client_silent_in_an_exact_round_is_estimated_from_its_history(world):
    """As training tolerates a missing reply (min-reply-fraction), so does FedRecover: in an exact
    round after the warm-up the silent client's update is estimated from its L-BFGS pairs, and the
    recovered model stays as close to retraining as without the silence."""
    data, store, original, retrained = world
    clean = fedrecover(store, [MALICIOUS], _Clients(data), SCHEDULE)
    later = [t for t in clean.exact_rounds if t > SCHEDULE.warmup_rounds][0]
    exact, _ = _silent(data, lambda t, k: (t, k) == (later, 0))
    result = fedrecover(store, [MALICIOUS], exact, SCHEDULE, min_reply_fraction=0.5)
    assert result.missing == {later: [0]}
    step = result.steps[later - 1]
    assert step.missing == [0] and 0 not in step.exact and 0 in step.clients
    gap = _distance(original, retrained)
    assert _distance(result.model, retrained) < _distance(clean.model, retrained) + 5e-3 * gap


def test_a_client_silent_from_the_start_is_left_out_while_enough_remain(world):
    data, store, original, retrained = world
    exact, clients = _silent(data, lambda t, k: k == 0)
    result = fedrecover(store, [MALICIOUS], exact, SCHEDULE, min_reply_fraction=0.5)
    asked = {t for t, who in clients.calls if 0 in who}
    assert set(result.missing) == asked and all(c == [0] for c in result.missing.values())
    assert all(torch.isfinite(v).all() for v in result.model.values())
    # ... and below the fraction it stops, naming the round and the clients
    exact, _ = _silent(data, lambda t, k: k in (0, 1))
    with pytest.raises(fedrecover_module.NotEnoughReplies, match="round 1: 1 of 3 clients"):
        fedrecover(store, [MALICIOUS], exact, SCHEDULE, min_reply_fraction=0.5)


def _planted_store(path, store, t_planted, client):
    """A copy of ``store`` whose ``client`` update of round ``t_planted`` is 10⁴ times too large."""
    planted = UpdateStore(path)
    for t in store.rounds():
        updates = {}
        for k, n in store.num_examples(t).items():
            update = store.read_update(t, k)
            if (t, k) == (t_planted, client):
                update = {key: 1e4 * value for key, value in update.items()}
            updates[k] = (update, n)
        planted.write_round(t, store.read_global(t), updates)
    return planted


def test_abnormality_fixing_replaces_a_huge_estimate_by_the_exact_update(world, tmp_path):
    data, store, original, retrained = world
    planted = _planted_store(tmp_path / "planted", store, t_planted=38, client=0)
    groups = parameter_groups(store.read_global(1))
    tau = abnormality_thresholds(store, [MALICIOUS], groups, 1e-3)[0]  # from the clean history
    schedule = FedRecoverSchedule(
        warmup_rounds=4,
        correction_period=10,
        final_tuning_rounds=2,
        buffer_size=2,
        abnormality_threshold=tau,
    )
    clients = _Clients(data)
    fixed = fedrecover(planted, [MALICIOUS], clients, schedule)
    assert fixed.fixed == {38: [0]}
    assert (38, [0]) in clients.calls
    assert fixed.steps[37].exact == [0] and fixed.steps[37].fixed == [0]
    gap = _distance(original, retrained)
    assert _distance(fixed.model, retrained) < 5e-3 * gap
    unfixed_schedule = FedRecoverSchedule(
        warmup_rounds=4,
        correction_period=10,
        final_tuning_rounds=2,
        buffer_size=2,
        abnormality_threshold=math.inf,
    )
    unfixed = fedrecover(planted, [MALICIOUS], _Clients(data), unfixed_schedule)
    assert unfixed.fixed == {}
    assert _distance(unfixed.model, retrained) > gap


def test_a_history_with_a_missing_round_is_refused(tmp_path):
    store = UpdateStore(tmp_path / "store")
    for t in (1, 2, 4):
        store.write_round(t, _initial_model(), {0: (_initial_model(), 1)})
    with pytest.raises(ConfigError, match="history"):
        fedrecover(store, [], _Clients({}), SCHEDULE)


# ------------------------------------------------------------------------------------ stacks
STACK_ROUNDS = 20


def _stack_world(tmp_path):
    """Two members trained on their own data from their own initial models, retained as one
    stacked history and as one history per member."""
    stores = [UpdateStore(tmp_path / f"member{i}") for i in range(2)]
    data = [_client_data(seed=10 + i) for i in range(2)]
    for i in range(2):
        _fedavg(_initial_model(seed=20 + i), data[i], STACK_ROUNDS, _participants, stores[i])
    stacked = UpdateStore(tmp_path / "stack")
    for t in stores[0].rounds():
        model = {
            f"members.{i}.{k}": v for i in range(2) for k, v in stores[i].read_global(t).items()
        }
        updates = {}
        for k, n in stores[0].num_examples(t).items():
            update = {
                f"members.{i}.{key}": value
                for i in range(2)
                for key, value in stores[i].read_update(t, k).items()
            }
            updates[k] = (update, n)
        stacked.write_round(t, model, updates)
    return data, stores, stacked


def test_each_member_of_a_stack_is_recovered_as_if_alone(tmp_path):
    data, stores, stacked = _stack_world(tmp_path)
    schedule = FedRecoverSchedule(
        warmup_rounds=4,
        correction_period=10,
        final_tuning_rounds=2,
        buffer_size=2,
        abnormality_threshold=math.inf,
    )
    alone = [fedrecover(stores[i], [MALICIOUS], _Clients(data[i]), schedule) for i in range(2)]

    def stack_clients(t, model, who):  # client k trains member i on its data of member i's world
        out = {}
        for k in who:
            update = {}
            for i in range(2):
                update.update(_local_update(model, *data[i][k], prefix=f"members.{i}."))
            out[k] = update
        return out

    groups = [[f"members.{i}.weight", f"members.{i}.bias"] for i in range(2)]
    grouped = fedrecover(stacked, [MALICIOUS], stack_clients, schedule, groups=groups)
    for i in range(2):
        for key in ("weight", "bias"):
            assert torch.allclose(
                grouped.model[f"members.{i}.{key}"], alone[i].model[key], rtol=1e-5, atol=1e-6
            )
    assert grouped.exact_client_rounds == alone[0].exact_client_rounds
    # one L-BFGS over both members mixes their curvature: not the same recovery
    mixed = fedrecover(stacked, [MALICIOUS], stack_clients, schedule)
    gaps = [
        _distance({k: mixed.model[f"members.{i}.{k}"] for k in ("weight", "bias")}, alone[i].model)
        for i in range(2)
    ]
    assert max(gaps) > 1e-4


@pytest.mark.parametrize(
    "groups",
    [[["weight"], ["weight"]], [["nothing"]], [[]], [["count"]]],
)
def test_bad_groups_are_refused(groups):
    state = {
        "weight": torch.zeros(2),
        "bias": torch.zeros(1),
        "count": torch.zeros(1, dtype=torch.int64),
    }
    with pytest.raises(ConfigError, match="groups"):
        parameter_groups(state, groups)


def test_integer_buffers_are_not_in_the_default_group():
    state = {"weight": torch.zeros(2), "count": torch.zeros(1, dtype=torch.int64)}
    assert parameter_groups(state) == [["weight"]]


def test_a_client_first_sampled_after_the_warm_up_computes_exactly_then_is_estimated(tmp_path):
    """Under client sampling client 1 first takes part in round 10, after the warm-up (rounds
    1-4): it has no L-BFGS pair, so round 10 asks it for its exact update (its stored one, from
    a model that saw the removed client, is not used uncorrected); its later rounds are
    estimated from that pair. The recovery still lands near retraining."""
    data = _client_data(seed=1)

    def sampled(t: int) -> list[int]:
        return [k for k in _participants(t) if k != 1 or t >= 10]

    store = UpdateStore(tmp_path / "store")
    original = _fedavg(_initial_model(), data, ROUNDS, sampled, store)
    honest = lambda t: [k for k in sampled(t) if k != MALICIOUS]  # noqa: E731
    retrained = _fedavg(store.read_global(1), data, ROUNDS, honest)
    clients = _Clients(data)
    result = fedrecover(store, [MALICIOUS], clients, SCHEDULE)
    assert result.unpaired == {10: [1]}
    assert (10, [1]) in clients.calls and 10 in result.estimated_rounds
    asked_one = [t for t, who in clients.calls if 1 in who]
    assert asked_one[0] == 10 and 11 not in asked_one  # estimated from its pair afterwards
    gap = _distance(original, retrained)
    assert _distance(result.model, retrained) < 5e-2 * gap
