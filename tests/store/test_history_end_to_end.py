"""History that forgets, end to end (in-process simulation, digits).

After a request, an attacker holding every file left in the run directory tries to rebuild the
forgotten client's updates: with the design's formula U_k^t = (N/N_k)(M^{t+1} − M^t) −
Σ_{j≠k}(N_j/N_k)U_j^t over every pair of kept models, and with a least-squares fit over every kept
model and update. Both fail; the same attack on the files the run kept before (``keep-original``)
rebuilds them. Sequential requests give the models of one request forgetting all targets, also when
the later request is the README's short recipe and clients must take the trained run's settings.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from fedunlearn.store.update_store import UpdateStore

TARGET = 1


def train_and_forget(tmp_path: Path, simulate, name: str, clients: int = 3, **extra) -> Path:
    overrides = {
        "num-clients": clients,
        "rounds": 4,
        "local-epochs": 1,
        "retain-interval": 1,
        "output-dir": str(tmp_path),
        "run-name": name,
        "node-wait-seconds": 60,
        "unlearn-clients": str(TARGET),
        **extra,
    }
    simulate(overrides, num_supernodes=clients)
    return tmp_path / name


def flat(state: dict[str, torch.Tensor], keys: list[str]) -> np.ndarray:
    return np.concatenate([state[k].double().numpy().ravel() for k in keys])


def model_vectors(root: Path, keys: list[str]) -> dict[str, np.ndarray]:
    """Every model-shaped tensor set in any .safetensors file under ``root`` (models and blobs)."""
    found = {}
    for file in sorted(root.rglob("*.safetensors")):
        state = load_file(str(file))
        if sorted(state) == sorted(keys):
            found[str(file.relative_to(root))] = flat(state, keys)
    return found


def truth(original_store: Path, keys: list[str]):
    """The target's true updates U_k^t, the others' updates and N_k, from the original store."""
    store = UpdateStore(original_store, readonly=True)
    rounds = {}
    for t in store.rounds():
        retained = store.read_round(t)
        rounds[t] = {
            "global": flat(retained.global_model, keys),
            "updates": {k: flat(u, keys) for k, u in retained.updates.items()},
            "n": dict(retained.num_examples),
        }
    return rounds


def formula_error(vectors: dict[str, np.ndarray], rounds: dict, kept_updates) -> float:
    """The best relative error of U_k^t = (N/N_k)(B − A) − Σ_{j≠k}(N_j/N_k)U_j^t over every
    ordered pair of kept model vectors (A, B) and every round t, with the kept updates of the
    other clients for U_j^t (the attacker's best use of the formula)."""
    best = np.inf
    names = list(vectors)
    for t, data in rounds.items():
        if TARGET not in data["updates"]:
            continue
        target = data["updates"][TARGET]
        n = data["n"]
        total = sum(n.values())
        others = sum(n[j] / n[TARGET] * kept_updates(t, j) for j in n if j != TARGET)
        for a in names:
            for b in names:
                if a != b:
                    guess = total / n[TARGET] * (vectors[b] - vectors[a]) - others
                    best = min(best, np.linalg.norm(guess - target) / np.linalg.norm(target))
    return float(best)


def least_squares_error(vectors: dict[str, np.ndarray], rounds: dict) -> float:
    """The best relative residual of the target's updates fitted by every kept vector (and so by
    every difference and combination of them)."""
    basis = np.stack(list(vectors.values()), axis=1)
    best = np.inf
    for data in rounds.values():
        if TARGET in data["updates"]:
            target = data["updates"][TARGET]
            coef, *_ = np.linalg.lstsq(basis, target, rcond=None)
            residual = np.linalg.norm(basis @ coef - target) / np.linalg.norm(target)
            best = min(best, residual)
    return float(best)


def no_leak_errors(rounds: dict) -> tuple[float, float]:
    """What an attacker gets without any file that holds the target's influence, given the other
    clients' true updates of every round and the initial model: the best relative error of taking
    U_k^t to be the others' mean update of round t, and of the least-squares fit of U_k^t by all
    those vectors (the baselines of the formula attack and of the fit)."""
    others = [u for data in rounds.values() for j, u in data["updates"].items() if j != TARGET]
    vectors = {str(i): u for i, u in enumerate(others)}
    vectors["initial"] = rounds[min(rounds)]["global"]
    best = np.inf
    for data in rounds.values():
        updates = data["updates"]
        if TARGET in updates and len(updates) > 1:
            guess = np.mean([u for j, u in updates.items() if j != TARGET], axis=0)
            target = updates[TARGET]
            best = min(best, np.linalg.norm(guess - target) / np.linalg.norm(target))
    return float(best), least_squares_error(vectors, rounds)


#: A kept file "rebuilds" the target's updates when the attack on it beats the no-leak guess by
#: more than this share (the attack and the guess fluctuate by a few percent with the data).
NO_LEAK_MARGIN = 0.1

EVERY_METHOD = "federaser,fedaccum,fedrecover,crab,sifu,fedretrain"


BASIC = "federaser,fedaccum,fedretrain"


@pytest.mark.parametrize(
    ("interval", "methods", "clients"),
    [(1, BASIC, 3), (2, BASIC, 3), (2, EVERY_METHOD, 3), (1, BASIC, 4), (1, BASIC, 10)],
)
def test_no_kept_file_rebuilds_the_forgotten_clients_updates(
    tmp_path, simulate, interval, methods, clients
):
    # The same training, identical bit for bit, without the request: the truth, and what a run
    # kept before this design (the original store and models). With every method, the training
    # run keeps every round's global model and update (FedRecover): the most an attacker can get.
    # FedEraser's trajectory is the one under attack: adopted however far it is from FedRetrain
    # after 4 short rounds (auto would adopt FedRetrain's: FedEraser's model is flagged here)
    settings = {
        "retain-interval": interval,
        "unlearn-methods": methods,
        "unlearn-adopt": "federaser",
    }
    trained = train_and_forget(
        tmp_path, simulate, "trained", clients, **settings, **{"unlearn-clients": ""}
    )
    default = train_and_forget(tmp_path, simulate, "default", clients, **settings)
    keys = sorted(load_file(str(default / "model_initial.safetensors")))
    rounds = truth(trained / "store", keys)
    assert rounds and all(TARGET in r["updates"] for r in rounds.values())

    # The attack works on the files the run kept before this design ...
    before = model_vectors(trained, keys)
    original_update = lambda t, j: rounds[t]["updates"][j]  # noqa: E731
    if interval == 1 or methods == EVERY_METHOD:
        rebuilt = formula_error(before, rounds, original_update)
        print(f"rebuild error before: {rebuilt:.3g}")
        assert rebuilt < 1e-4
    # ... and the default run keeps none of those files and nothing that rebuilds the updates.
    left = model_vectors(default, keys)
    assert not any(name.startswith("original") for name in left)
    originals = [r["global"] for t, r in rounds.items() if t > 1] + [
        flat(load_file(str(trained / "model_final.safetensors")), keys)
    ]
    for vector in left.values():
        assert all(not np.allclose(vector, o, rtol=0, atol=1e-7) for o in originals)
    store = UpdateStore(default / "store", readonly=True)
    assert TARGET not in store.clients()
    # nothing of the training run's retention record or policy states survives the rewrite
    assert "retention-state" not in store.metadata

    def kept_update(t, j):
        kept = t in store.rounds() and j in store.clients(t)
        return flat(store.read_update(t, j), keys) if kept else 0.0

    formula, fitted = formula_error(left, rounds, kept_update), least_squares_error(left, rounds)
    guess, guess_fit = no_leak_errors(rounds)
    print(
        f"rebuild errors after unlearning (K={clients}, dt={interval}): formula {formula:.3g}, "
        f"fit {fitted:.3g}; without the kept files: mean guess {guess:.3g}, fit {guess_fit:.3g}"
    )
    # No kept file lets the attacker do better than guessing without it.
    assert formula >= (1 - NO_LEAK_MARGIN) * guess
    assert fitted >= (1 - NO_LEAK_MARGIN) * guess_fit
    if (
        interval == 1 and methods != EVERY_METHOD and clients == 3
    ):  # resuming the finished request changes nothing: it is done and adopted
        before_resume = {p.name: p.read_bytes() for p in default.rglob("*") if p.is_file()}
        train_and_forget(tmp_path, simulate, "default", clients, resume=True)
        after = {p.name: p.read_bytes() for p in default.rglob("*") if p.is_file()}
        assert set(after) - set(before_resume) == {"recovery_log.jsonl"}  # the resume's record
        assert set(before_resume) <= set(after)
        assert all(after[n] == before_resume[n] for n in after if not n.endswith(".jsonl"))
    [entry] = [json.loads(line) for line in (default / "history_log.jsonl").open()]
    assert entry["adopted"] == "federaser" and not entry["kept_original"]
    assert sorted(p.name for p in default.glob("*.safetensors")) == [
        "model_federaser.safetensors",
        "model_fedretrain.safetensors",
        "model_final.safetensors",
        "model_initial.safetensors",
    ]


def test_sequential_requests_give_the_models_of_one_request_also_from_the_short_recipe(
    tmp_path, simulate
):
    settings = {"num-clients": 4, "partitioning": "shards", "seed": 3, "rounds": 4,
                "local-epochs": 1, "retain-interval": 1}  # fmt: skip
    common = {"output-dir": str(tmp_path), "node-wait-seconds": 60}
    simulate({**settings, **common, "run-name": "once", "unlearn-clients": "1,2",
              "unlearn-adopt": "fedretrain"}, num_supernodes=4)  # fmt: skip
    simulate({**settings, **common, "run-name": "twice", "unlearn-clients": "1",
              "keep-original": True}, num_supernodes=4)  # fmt: skip
    # The README's short recipe: no data settings, no num-clients. The clients must still build
    # the trained run's shards (their own run config says iid, seed 0, 10 clients).
    simulate({**common, "run-name": "twice", "unlearn-only": True, "unlearn-clients": "2"},
             num_supernodes=4)  # fmt: skip

    once, twice = tmp_path / "once", tmp_path / "twice"
    for method in ("federaser", "fedretrain"):
        one = load_file(str(once / f"model_{method}.safetensors"))
        two = load_file(str(twice / f"model_{method}-2.safetensors"))
        assert all(torch.equal(one[k], two[k]) for k in one), method
    final = load_file(str(twice / "model_final.safetensors"))
    adopted = load_file(str(twice / "model_federaser-2.safetensors"))
    assert all(torch.equal(final[k], adopted[k]) for k in final)  # FedEraser was adopted

    # keep-original = true kept request 1's previous history aside (and said so); request 2 did not.
    history = [json.loads(line) for line in (twice / "history_log.jsonl").open()]
    assert [(h["request"], h["kept_original"]) for h in history] == [(1, True), (2, False)]
    assert (twice / "original-1" / "store" / "store.json").is_file()
    assert (twice / "original-1" / "model_final.safetensors").is_file()
    assert not (twice / "original-2").exists()
    store = UpdateStore(twice / "store", readonly=True)
    assert store.clients() == [0, 3] and store.rounds() == [1, 2, 3, 4]

    # FedRetrain adopted: the history is its own trajectory, without either target.
    retrained = UpdateStore(once / "store", readonly=True)
    assert retrained.rounds() == [1, 2, 3, 4] and retrained.clients() == [0, 3]
    initial = load_file(str(once / "model_initial.safetensors"))
    assert all(torch.equal(initial[k], retrained.read_global(1)[k]) for k in initial)
    final = load_file(str(once / "model_final.safetensors"))
    fedretrain = load_file(str(once / "model_fedretrain.safetensors"))
    assert all(torch.equal(final[k], fedretrain[k]) for k in final)
