"""Crab (Jiang, Shen et al., TIFS 2025) as the authors' code does it: time windows cut by the loss,
rounds kept by the KL divergence of their global step, clients by their model's alignment with the
global model, and a recovery that rolls back to the first kept round and re-runs the kept rounds
after it; our sensitivity rollback as the option. Histories of a tiny pure-torch FedAvg federation
and a hand-made one."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import pytest
import torch
import torch.nn.functional as F

from fedunlearn.errors import ConfigError
from fedunlearn.store.update_store import UpdateStore
from fedunlearn.training.model_state import state_difference, state_norm, state_sum
from fedunlearn.unlearning.crab import CrabSelector
from fedunlearn.unlearning.crab_recovery import (
    crab_recover,
    excluded_sensitivities,
    rollback_rounds,
)
from fedunlearn.unlearning.federaser import aggregate_updates

CLASSES, DIM, SAMPLES = 3, 5, 40
MEANS = 2.0 * torch.eye(CLASSES, DIM)


@pytest.fixture(autouse=True)
def one_thread():
    """Tensors of a few dozen numbers: a second intra-op thread only waits (45x slower when the
    machine is busy)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ------------------------------------------------------------------ a hand-made history


def _t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


HAND_N = {0: 1, 1: 1, 2: 2}
HAND_DIRECTIONS = {
    0: {"w": _t([[1, 0, -1], [0, 1, 0]]), "b": _t([1.0, -1.0])},
    1: {"w": _t([[1, 1, 0], [-1, 1, 0]]), "b": _t([-3.0, 3.0])},
    2: {"w": _t([[0.5, 0, -0.5], [0, 0.5, 0.5]]), "b": _t([0.0, 0.0])},
}
HAND_SCALES = [0.3, 0.9, 1.2, 0.2, 0.6, 0.5]
HAND_SIGNS = [(1, 1, 1), (1, -1, 1), (-1, 1, 1), (1, 1, -1), (1, -1, 1), (-1, 1, 1)]
# L^t: 0.85 < 0.9 * 1.0 closes [1] at round 2; 0.70 < 0.9 * 0.85 closes [2, 3] at round 4; the
# final round 6 closes [4, 5, 6] (0.65 >= 0.9 * 0.70).
HAND_LOSSES = [1.0, 0.85, 0.80, 0.70, 0.68, 0.65]


def _hand_history():
    """[(t, M^t, {k: U_k^t}, M^{t+1}, L^t)] of six rounds, three clients."""
    model = {"w": _t([[0.2, -0.1, 0.0], [0.0, 0.3, -0.2]]), "b": _t([0.0, 0.1])}
    history = []
    for t, (scale, signs, loss) in enumerate(zip(HAND_SCALES, HAND_SIGNS, HAND_LOSSES), start=1):
        updates = {
            k: {key: scale * signs[k] * d for key, d in HAND_DIRECTIONS[k].items()}
            for k in HAND_DIRECTIONS
        }
        after = {
            key: model[key] + sum(HAND_N[k] * updates[k][key] for k in updates) / 4 for key in model
        }
        history.append((t, model, updates, after, loss))
        model = after
    return history


def _softmax(row: list[float]) -> list[float]:
    exps = [math.exp(x) for x in row]
    return [e / sum(exps) for e in exps]


def _hand_kl(before, after) -> float:
    """Σ over tensors and rows of KL(softmax(before) ‖ softmax(after)), by hand."""
    total = 0.0
    for key in before:
        rows_p, rows_q = before[key].tolist(), after[key].tolist()
        if before[key].dim() == 1:
            rows_p, rows_q = [rows_p], [rows_q]
        for p_row, q_row in zip(rows_p, rows_q):
            p, q = _softmax(p_row), _softmax(q_row)
            total += sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))
    return total


def _hand_alignment(client_model, global_model) -> float:
    """The mean row cosine of the weight matrix (the only tensor of two dimensions), by hand."""
    cosines = []
    for c_row, g_row in zip(client_model["w"].tolist(), global_model["w"].tolist()):
        dot = sum(c * g for c, g in zip(c_row, g_row))
        cosines.append(dot / math.sqrt(sum(c * c for c in c_row) * sum(g * g for g in g_row)))
    return sum(cosines) / len(cosines)


def test_the_selection_equals_a_hand_computation_on_a_toy_history():
    history = _hand_history()
    # By hand: the windows the losses cut, the ⌊P·n⌋ (>= 1) rounds of largest KL in each, the
    # ⌊X·m⌋ = ⌊0.7·3⌋ = 2 clients of largest alignment in each kept round.
    windows = [[1], [2, 3], [4, 5, 6]]
    kl = {t: _hand_kl(before, after) for t, before, _, after, _ in history}
    kept_rounds = []
    for window in windows:
        count = max(1, math.floor(0.7 * len(window) + 1e-9))
        kept_rounds += sorted(sorted(window, key=lambda t: -kl[t])[:count])
    expected = {}
    for t, before, updates, after, _ in history:
        if t in kept_rounds:
            alignment = {
                k: _hand_alignment({"w": before["w"] + u["w"]}, after) for k, u in updates.items()
            }
            expected[t] = sorted(sorted(alignment, key=lambda k: -alignment[k])[:2])
    assert expected == {1: [0, 2], 3: [1, 2], 5: [0, 2], 6: [0, 2]}  # the hand computation

    selector = CrabSelector(round_ratio=0.7, client_ratio=0.7, loss_drop=0.1, final_round=6)
    settled = []
    for t, model, updates, _, loss in history:
        provisional = selector.select(t, model, updates, HAND_N, loss=loss)
        assert provisional.keep_global and provisional.clients == {0, 1, 2}  # whole until chosen
        settled.append(selector.settle())
    assert selector.kept == expected
    assert settled == [
        {},
        {1: (0, 2)},
        {},
        {2: None, 3: (1, 2)},
        {},
        {4: None, 5: (0, 2), 6: (0, 2)},
    ]
    assert selector.open_rounds == []


def test_the_hand_history_tells_apart_the_readings_the_selection_does_not_follow():
    # The premises of the test above: the code's one-round shift (round t scored by round t+1's
    # step) would keep round 2, not 3, of the window [2, 3]; the cosine of the updates instead of
    # the models would keep client 1 of round 6; biases in the cosine, client 1 of round 1.
    history = {t: (m, u, a) for t, m, u, a, _ in _hand_history()}
    kl = {t: _hand_kl(m, a) for t, (m, _, a) in history.items()}
    shifted = []
    for window in ([1], [2, 3], [4, 5, 6]):
        candidates = window[:-1] or window  # the code never scores a window's last round
        count = max(1, math.floor(0.7 * len(window) + 1e-9))
        score = {t: kl.get(t + 1, 0.0) if len(window) > 1 else 0.0 for t in candidates}
        shifted += sorted(sorted(candidates, key=lambda t: -score[t])[:count])
    assert shifted == [1, 2, 4, 5]  # not the rounds 1, 3, 5, 6 the selection keeps
    m, u, a = history[6]
    step = {"w": a["w"] - m["w"]}
    by_update = {k: _hand_alignment({"w": u[k]["w"]}, step) for k in u}
    assert sorted(by_update, key=lambda k: -by_update[k])[:2] == [1, 2]
    m, u, a = history[1]

    def whole(k):
        client = torch.cat([(m[key] + u[k][key]).flatten() for key in m])
        return float(F.cosine_similarity(client, torch.cat([a[key].flatten() for key in m]), dim=0))

    assert sorted(range(3), key=lambda k: -whole(k))[:2] == [2, 1]


def test_a_window_bound_closes_windows_without_a_loss():
    history = _hand_history()
    selector = CrabSelector(round_ratio=0.5, client_ratio=1.0, window=2, final_round=6)
    for t, model, updates, _, _ in history:
        selector.select(t, model, updates, HAND_N)
    kl = {t: _hand_kl(m, a) for t, m, _, a, _ in history}
    expected = [max(pair, key=lambda t: kl[t]) for pair in ([1, 2], [3, 4], [5, 6])]
    assert list(selector.kept) == expected
    assert all(clients == [0, 1, 2] for clients in selector.kept.values())


def test_without_a_final_round_the_last_window_stays_open_until_closed():
    selector = CrabSelector()
    for t, model, updates, _, _ in _hand_history():
        selector.select(t, model, updates, HAND_N)
    assert selector.kept == {} and selector.open_rounds == [1, 2, 3, 4, 5, 6]
    decisions = selector.close()
    assert sorted(t for t, c in decisions.items() if c is not None) == list(selector.kept)
    assert len(selector.kept) == math.floor(0.6 * 6)


# ------------------------------------------------------------------ a toy FedAvg federation


def _client_data(seed: int, client: int, flip: bool) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * seed + client)
    y = torch.randint(0, CLASSES, (SAMPLES,), generator=g)
    x = MEANS[y] + torch.randn(SAMPLES, DIM, generator=g)
    return x, (y + 1) % CLASSES if flip else y


def _gradient(model, data) -> dict:
    """The mean cross-entropy's gradient for softmax regression, in closed form."""
    x, y = data
    residual = torch.softmax(x @ model["w"].T + model["b"], dim=1) - F.one_hot(y, CLASSES)
    return {"w": residual.T @ x / len(y), "b": residual.mean(0)}


def sgd(model, data, lr: float) -> dict:
    """Three full-batch gradient steps: a deterministic function of (model, data), as exact is."""
    current = {k: v.clone() for k, v in model.items()}
    for _ in range(3):
        g = _gradient(current, data)
        current = {k: current[k] - lr * g[k] for k in current}
    return state_difference(current, model)


def normalized(model, data, lr: float) -> dict:
    """One normalised gradient step per tensor: ‖U[tensor]‖ = lr whatever the model."""
    g = _gradient(model, data)
    return {k: -lr * g[k] / g[k].norm() for k in g}


@dataclass
class Federation:
    """K clients with local data; ``flipped`` train on flipped labels, ``quiet`` at a learning rate
    of 1e-7 (no influence); ``local`` computes an update."""

    clients: int = 6
    flipped: tuple = ()
    quiet: tuple = ()
    local: object = sgd
    seed: int = 0
    data: dict = field(init=False)

    def __post_init__(self):
        self.data = {k: _client_data(self.seed, k, k in self.flipped) for k in range(self.clients)}
        self.n = {k: SAMPLES + 5 * k for k in range(self.clients)}

    def exact(self, round, model, clients):
        lr = {k: 1e-7 if k in self.quiet else 0.5 for k in clients}
        if self.local is normalized:
            lr = {k: 1e-7 if k in self.quiet else 0.1 for k in clients}
        return {k: self.local(model, self.data[k], lr[k]) for k in clients}

    def loss(self, model, clients) -> float:
        """L^t: the mean cross-entropy of ``model`` over the clients' data."""
        total = sum(
            float(F.cross_entropy(x @ model["w"].T + model["b"], y, reduction="sum"))
            for x, y in (self.data[k] for k in clients)
        )
        return total / sum(len(self.data[k][1]) for k in clients)

    def initial(self) -> dict:
        g = torch.Generator().manual_seed(7 + self.seed)
        return {"w": 0.1 * torch.randn(CLASSES, DIM, generator=g), "b": torch.zeros(CLASSES)}


def train(fed: Federation, rounds: int, selector=None, store=None, full=None, without=()):
    """FedAvg over ``rounds``; returns [(t, M^t, {k: U_k^t})] and the final model M^{T+1}. With a
    selector, each round goes to ``store`` whole and what the selector settles is deleted, as the
    retaining strategy does."""
    model, trajectory = fed.initial(), []
    clients = [k for k in range(fed.clients) if k not in without]
    for t in range(1, rounds + 1):
        updates = fed.exact(t, model, clients)
        if full is not None:
            full.write_round(t, model, {k: (updates[k], fed.n[k]) for k in updates})
        if selector is not None:
            loss = fed.loss(model, clients)
            selector.select(t, model, updates, fed.n, loss=loss)
            if store is not None:
                store.write_round(t, model, {k: (updates[k], fed.n[k]) for k in updates})
                for decided, kept in selector.settle().items():
                    unkept = None if kept is None else set(updates) - set(kept)
                    if unkept != set():
                        store.delete_from_round(decided, unkept)
        trajectory.append((t, model, updates))
        model = state_sum(model, aggregate_updates(updates, fed.n))
    return trajectory, model


def _distance(a, b) -> float:
    return state_norm(state_difference(a, b))


def test_the_store_keeps_only_the_chosen_rounds_and_clients_once_each_window_closes(tmp_path):
    fed = Federation(flipped=(5,))
    selected, full = UpdateStore(tmp_path / "crab"), UpdateStore(tmp_path / "full")
    selector = CrabSelector(final_round=15)
    train(fed, 15, selector, selected, full)
    assert selected.rounds() == list(selector.kept) and len(selector.kept) < 15
    assert all(selected.clients(t) == c for t, c in selector.kept.items())
    assert all(len(c) == 4 for c in selector.kept.values())  # ⌊0.7·6⌋
    assert selected.total_bytes() < 0.6 * full.total_bytes()
    assert selected.verify() == []


def test_a_resumed_selector_decides_as_an_uninterrupted_one():
    fed = Federation(flipped=(2,))
    trajectory, _ = train(fed, 14)
    losses = [fed.loss(m, range(fed.clients)) for _, m, _ in trajectory]

    def run(selector, rounds):
        return [
            (selector.select(t, m, u, fed.n, loss=losses[t - 1]), selector.settle())
            for t, m, u in rounds
        ]

    whole = CrabSelector(round_ratio=0.5, final_round=14)
    decisions = run(whole, trajectory)
    prefix = CrabSelector(round_ratio=0.5, final_round=14)
    assert run(prefix, trajectory[:6]) == decisions[:6]
    assert prefix.open_rounds  # the cut falls inside a window
    resumed = CrabSelector(round_ratio=0.5, final_round=14)
    resumed.load_state_dict(json.loads(json.dumps(prefix.state_dict(), allow_nan=False)))
    assert run(resumed, trajectory[6:]) == decisions[6:]
    assert resumed.state_dict() == whole.state_dict()
    assert len({len(w) for w in _windows(decisions)}) > 1  # the losses cut windows of several sizes


def _windows(decisions) -> list[list[int]]:
    return [sorted(settled) for _, settled in decisions if settled]


def test_a_state_of_the_online_format_or_of_other_hyper_parameters_is_refused():
    fed = Federation()
    selector = CrabSelector(round_ratio=0.5)
    trajectory, _ = train(fed, 3, selector)
    state = selector.state_dict()
    with pytest.raises(ConfigError, match="crab-state.*format 2.*train the run again"):
        CrabSelector(round_ratio=0.5).load_state_dict({**state, "format": 1})
    with pytest.raises(ConfigError, match="crab-round-ratio"):
        CrabSelector(round_ratio=0.6).load_state_dict(state)
    t, model, updates = trajectory[-1]
    with pytest.raises(ValueError, match="round 3 after round 3"):
        selector.select(t, model, updates, fed.n)


def test_forgetting_a_client_removes_it_from_every_part_of_the_saved_state():
    fed = Federation()
    selector = CrabSelector(round_ratio=0.5, client_ratio=1.0, window=4)
    train(fed, 6, selector)
    state = CrabSelector.forget_in_state(json.loads(json.dumps(selector.state_dict())), {3})
    assert all("3" not in r["clients"] for r in state["influence"].values())
    assert all(3 not in kept for kept in state["kept"].values()) and state["kept"]
    alignments = state["window"]["alignments"]
    assert alignments and all("3" not in a for a in alignments)
    # a state of the online format (a run trained before) forgets the parts it has
    old = {"format": 1, "window": {"divergences": [0.1]}, "kept": {"1": [2, 3]}, "influence": {}}
    assert CrabSelector.forget_in_state(old, {3})["kept"] == {"1": [2]}


# ------------------------------------------------------------------ recovery


class Spy:
    """The store's read API, recording what the recovery reads."""

    def __init__(self, store):
        self.store, self.read = store, []

    def rounds(self):
        return self.store.rounds()

    def read_global(self, round):
        return self.store.read_global(round)

    def read_round(self, round, clients=None, exclude=()):
        retained = self.store.read_round(round, clients=clients, exclude=exclude)
        self.read += [(round, k) for k in retained.updates]
        return retained


def test_recovery_never_asks_or_reads_a_removed_client_even_once_its_blobs_are_deleted(tmp_path):
    fed = Federation(flipped=(3,))
    store = UpdateStore(tmp_path / "crab")
    selector = CrabSelector(client_ratio=1.0, final_round=12)  # a label-flipper is never aligned
    train(fed, 12, selector, store)
    assert all(3 in clients for clients in selector.kept.values())
    asked = []

    def exact(t, model, clients):
        asked.extend(clients)
        return fed.exact(t, model, clients)

    for rollback in ("first-kept", "sensitivity"):
        spy = Spy(store)
        before = crab_recover(spy, {3}, exact, rollback=rollback, influence=selector.influence)
        assert 3 not in asked and all(k != 3 for _, k in spy.read) and spy.read
    store.delete_client(3)
    after = crab_recover(
        store, {3}, fed.exact, rollback="sensitivity", influence=selector.influence
    )
    assert torch.equal(before.model["w"], after.model["w"])


def test_the_authors_recovery_rolls_back_to_the_first_kept_round_and_reruns_every_later_one(
    tmp_path,
):
    fed = Federation(flipped=(4, 5))
    store, selector = UpdateStore(tmp_path / "crab"), CrabSelector(final_round=15)
    _, poisoned = train(fed, 15, selector, store)
    _, retrained = train(fed, 15, without=(4, 5))
    result = crab_recover(store, {4, 5}, fed.exact)
    kept = list(selector.kept)
    assert result.rule == "first-kept" and result.rollback_round == kept[0]
    assert result.rounds == kept and result.rerun_rounds == kept[1:]
    remaining = {t: [k for k in c if k not in (4, 5)] for t, c in selector.kept.items()}
    assert result.clients == remaining
    assert result.exact_client_rounds == sum(len(remaining[t]) for t in kept[1:])
    assert _distance(result.model, retrained) < 0.5 * _distance(poisoned, retrained)


def test_every_round_kept_with_unit_steps_the_authors_recovery_equals_retraining(tmp_path):
    # Clients take one normalised step per tensor, so ‖Û_k‖ = ‖U_k‖ and calibration is the
    # identity; with P = X = 1 every round is replayed from M^1 with every remaining client, the
    # first from the stored updates (the model is M^1): exactly FedAvg retraining without client 0.
    fed = Federation(local=normalized, flipped=(0,))
    store = UpdateStore(tmp_path / "crab")
    selector = CrabSelector(round_ratio=1, client_ratio=1, final_round=8)
    train(fed, 8, selector, store)
    _, retrained = train(fed, 8, without=(0,))
    result = crab_recover(store, {0}, fed.exact)
    assert result.rollback_round == 1 and result.rerun_rounds == list(range(2, 9))
    assert result.exact_client_rounds == 7 * 5
    for key in retrained:
        assert torch.allclose(result.model[key], retrained[key], atol=1e-6)


def test_a_renewed_update_keeps_its_direction_and_takes_the_stored_norm_per_tensor(tmp_path):
    store = UpdateStore(tmp_path / "crab")
    m1 = {"w": torch.tensor([1.0, 1.0]), "b": torch.tensor([0.0])}
    stored1 = {"w": torch.tensor([0.5, 0.0]), "b": torch.tensor([1.0])}
    stored2 = {"w": torch.tensor([0.0, 3.0]), "b": torch.tensor([-2.0])}  # norms 3 and 2
    store.write_round(1, m1, {0: (stored1, 10), 1: ({"w": torch.ones(2), "b": torch.ones(1)}, 10)})
    store.write_round(2, m1, {0: (stored2, 10)})
    renewed = {"w": torch.tensor([4.0, 4.0]), "b": torch.tensor([0.1])}
    asked = []

    def exact(t, model, clients):
        asked.append((t, clients, model["w"].tolist()))
        return {0: renewed}

    result = crab_recover(store, {1}, exact)
    assert asked == [(2, [0], [1.5, 1.0])]  # M^1 plus client 0's stored round-1 update
    step_w = 3.0 * renewed["w"] / renewed["w"].norm()
    assert torch.allclose(result.model["w"], m1["w"] + stored1["w"] + step_w)
    assert torch.allclose(result.model["b"], torch.tensor([1.0 + 2.0]))
    assert [s.renewed for s in result.steps] == [False, True]


def test_a_renewal_answer_from_a_removed_client_is_refused(tmp_path):
    fed = Federation()
    store, selector = UpdateStore(tmp_path / "crab"), CrabSelector(1, 1, final_round=3)
    train(fed, 3, selector, store)
    with pytest.raises(RuntimeError, match="removed clients \\[1\\]"):
        crab_recover(store, {1}, lambda t, m, c: fed.exact(t, m, [*c, 1]))


# ------------------------------------------------------------------ our sensitivity rollback


def _sensitivity_run(tmp_path, fed, rounds=12, **kwargs):
    store = UpdateStore(tmp_path / "crab")
    selector = CrabSelector(final_round=rounds, keep_first_round=True, **kwargs)
    trajectory, final = train(fed, rounds, selector, store)
    return store, selector, trajectory, final


def test_with_the_sensitivity_rollback_round_one_is_always_kept(tmp_path):
    store, selector, _, _ = _sensitivity_run(tmp_path, Federation(), round_ratio=0.2)
    assert store.rounds()[0] == 1 and 1 in selector.kept


def test_the_recorded_sensitivity_never_understates_the_removed_clients_true_share():
    fed = Federation(flipped=(1, 4))
    selector = CrabSelector(final_round=10)
    trajectory, _ = train(fed, 10, selector)
    bounds = excluded_sensitivities(selector.state_dict()["influence"], {1, 4})
    for t, _, updates in trajectory:
        step = aggregate_updates(updates, fed.n)
        total = sum(fed.n.values())
        removed = {k: sum(fed.n[c] / total * updates[c][k] for c in (1, 4)) for k in step}
        assert bounds[t][0] >= state_norm(removed) / state_norm(step) - 1e-9
        assert bounds[t][0] > 0


def test_without_influence_of_the_removed_client_the_rollback_is_late_and_the_model_stays(tmp_path):
    store, selector, trajectory, final = _sensitivity_run(tmp_path, Federation(quiet=(2,)))
    quiet = Federation(quiet=(2,))
    result = crab_recover(
        store, {2}, quiet.exact, rollback="sensitivity", influence=selector.influence
    )
    assert result.rule == "sensitivity"
    assert result.rollback_round == store.rounds()[-1] > 1
    assert result.exact_client_rounds == 0 and result.rerun_rounds == []  # from stored updates
    assert _distance(result.model, final) < 0.1 * _distance(trajectory[0][1], final)
    # the authors' rule re-runs every kept round after the first whatever the client's influence
    authors = crab_recover(store, {2}, quiet.exact)
    assert authors.rollback_round == 1 and authors.rerun_rounds == store.rounds()[1:]


def test_a_poisoner_from_round_one_sends_the_sensitivity_rollback_to_round_one(tmp_path):
    fed = Federation(flipped=(4, 5))
    store, selector, _, poisoned = _sensitivity_run(tmp_path, fed, rounds=15)
    _, retrained = train(fed, 15, without=(4, 5))
    result = crab_recover(
        store, {4, 5}, fed.exact, rollback="sensitivity", influence=selector.influence
    )
    assert result.rollback_round == 1 and result.rounds == store.rounds()
    assert _distance(result.model, retrained) < 0.5 * _distance(poisoned, retrained)


def test_without_an_influence_record_the_sensitivity_rollback_is_the_first_kept_round(tmp_path):
    fed = Federation(quiet=(1,))
    store, _, _, _ = _sensitivity_run(tmp_path, fed, rounds=6)
    assert crab_recover(store, {1}, fed.exact, rollback="sensitivity").rollback_round == 1


def test_rollback_rounds_is_the_latest_retained_round_before_the_first_exceeding_one():
    shares = {1: [0.0, 0.0], 2: [0.05, 0.0], 3: [0.3, 0.0], 4: [0.01, 0.5], 5: [0.2, 0.0]}
    assert rollback_rounds([1, 3, 4, 5], shares, 0.1, 2) == [3, 4]
    assert rollback_rounds([1, 3, 4, 5], shares, 1.0, 2) == [5, 5]
    with pytest.raises(ValueError, match="no retained round precedes"):
        rollback_rounds([4, 5], shares, 0.1, 2)


def _stack(a: dict, b: dict) -> dict:
    return {f"members.{i}.{k}": v for i, s in enumerate((a, b)) for k, v in s.items()}


def _member(state: dict, i: int) -> dict:
    prefix = f"members.{i}."
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


@pytest.mark.parametrize("rollback", ["first-kept", "sensitivity"])
def test_a_two_member_stack_recovers_each_member_as_its_own_run(tmp_path, rollback):
    # Client 5 poisons member 0 from round 1 and has no influence on member 1. With P = X = 1 the
    # members' shared selection is every round and client, as each single run's.
    feds = [Federation(flipped=(5,), seed=0), Federation(quiet=(5,), seed=1)]
    groups = [[f"members.{i}.w", f"members.{i}.b"] for i in range(2)]
    selectors = [CrabSelector(1, 1, final_round=7) for _ in feds]
    stores = [UpdateStore(tmp_path / f"single{i}") for i in range(2)]
    runs = [train(f, 7, s, st) for f, s, st in zip(feds, selectors, stores)]
    stack_selector = CrabSelector(1, 1, final_round=7, groups=groups)
    stack_store = UpdateStore(tmp_path / "stack")
    for (t, m0, u0), (_, m1, u1) in zip(runs[0][0], runs[1][0]):
        updates = {k: _stack(u0[k], u1[k]) for k in u0}
        stack_selector.select(t, _stack(m0, m1), updates, feds[0].n)
        stack_store.write_round(t, _stack(m0, m1), {k: (updates[k], feds[0].n[k]) for k in updates})
    stack_selector.settle()
    assert stack_selector.kept == selectors[0].kept == selectors[1].kept

    def stack_exact(t, model, clients):
        answers = [f.exact(t, _member(model, i), clients) for i, f in enumerate(feds)]
        return {k: _stack(answers[0][k], answers[1][k]) for k in clients}

    kwargs = {"rollback": rollback}
    stacked = crab_recover(
        stack_store, {5}, stack_exact, influence=stack_selector.influence, groups=groups, **kwargs
    )
    expected = [1, 7] if rollback == "sensitivity" else [1, 1]
    assert stacked.rollback_rounds == expected
    for i in range(2):
        single = crab_recover(
            stores[i], {5}, feds[i].exact, influence=selectors[i].influence, **kwargs
        )
        assert single.rollback_round == stacked.rollback_rounds[i]
        for key, value in single.model.items():
            assert torch.allclose(_member(stacked.model, i)[key], value, atol=1e-6)


# ------------------------------------------------------------------ parameters


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"round_ratio": 0}, "crab-round-ratio"),
        ({"round_ratio": 1.2}, "crab-round-ratio"),
        ({"client_ratio": -0.1}, "crab-client-ratio"),
        ({"client_ratio": float("nan")}, "crab-client-ratio"),
        ({"client_ratio": "0.7"}, "crab-client-ratio"),
        ({"loss_drop": 1.0}, "crab-loss-drop"),
        ({"window": -1}, "crab-window"),
        ({"window": 2.5}, "crab-window"),
        ({"final_round": 0}, "rounds"),
    ],
)
def test_bad_selector_hyper_parameters_are_refused(kwargs, key):
    with pytest.raises(ConfigError, match=key):
        CrabSelector(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"sensitivity_bound": -0.1}, "crab-sensitivity-bound"),
        ({"sensitivity_bound": float("inf")}, "crab-sensitivity-bound"),
        ({"sensitivity_bound": float("nan")}, "crab-sensitivity-bound"),
        ({"sensitivity_bound": "0.1"}, "crab-sensitivity-bound"),
        ({"rollback": "latest"}, "crab-rollback.*first-kept, sensitivity"),
    ],
)
def test_bad_recovery_parameters_are_refused(tmp_path, kwargs, key):
    store = UpdateStore(tmp_path / "crab")
    train(Federation(), 2, CrabSelector(final_round=2), store)
    with pytest.raises(ConfigError, match=key):
        crab_recover(store, {0}, Federation().exact, **kwargs)


def test_groups_naming_unknown_or_shared_keys_are_refused():
    model = {"w": torch.zeros(2, 2), "b": torch.zeros(2)}
    updates = {0: {"w": torch.ones(2, 2), "b": torch.ones(2)}}
    for groups in ([["w"], ["w"]], [["v"]], [[]]):
        with pytest.raises(ConfigError, match="groups"):
            CrabSelector(groups=groups).select(1, model, updates, {0: 1})


@pytest.mark.parametrize("bad", [-1.0, float("inf")])
def test_a_saved_norm_outside_its_domain_is_refused_by_name(bad):
    fed = Federation()
    selector = CrabSelector(round_ratio=0.5)
    train(fed, 3, selector)
    state = json.loads(json.dumps(selector.state_dict(), allow_nan=False))
    CrabSelector(round_ratio=0.5).load_state_dict(state)  # intact: accepted
    record = next(iter(state["influence"].values()))
    client = next(iter(record["clients"]))
    record["clients"][client][0] = bad
    with pytest.raises(ConfigError, match="crab-state.*finite and >= 0"):
        CrabSelector(round_ratio=0.5).load_state_dict(state)
