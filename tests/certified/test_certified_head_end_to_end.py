"""End to end, in process: the certified head as a server-side plug-in on a federated digits model.

Four virtual clients train a DP body (DP-FedAvg), the server trains the certified head from the
clients' sums, removes single samples and then a whole client, and writes a certificate per request.
Then every byte the run wrote is searched for the perturbation b and for any head that determines it.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
from safetensors import safe_open

import fedunlearn.certified.removal as engine
from fedunlearn.certified.certificate import read_ledger, weights_sha256
from fedunlearn.certified.removal import CertifiedHead


def test_federated_certified_head_matches_central_and_certifies_every_request(
    tmp_path, simulate, monkeypatch
):
    # The ServerApp runs in this process: record every b it draws and every head it trains.
    drawn, trained = [], []
    draw, fit = engine.sample_perturbation, CertifiedHead.fit

    def recording_draw(*args, **kwargs):
        drawn.append(draw(*args, **kwargs))
        return drawn[-1]

    def recording_fit(head, *args, **kwargs):
        certificate = fit(head, *args, **kwargs)
        trained.append(head.weights.copy())
        return certificate

    monkeypatch.setattr(engine, "sample_perturbation", recording_draw)
    monkeypatch.setattr(CertifiedHead, "fit", recording_fit)
    overrides = {
        "num-clients": 4,
        "rounds": 2,
        "output-dir": str(tmp_path),
        "run-name": "certified",
        "node-wait-seconds": 60,
        "unlearn-clients": "",
        "certified-head": True,
        "certified-removals": 12,
        "certified-remove-clients": "2",
        "certified-eval-every": 4,
        "certified-mode": "fast",
        "dp-noise-multiplier": 1.0,
        "dp-clipping-norm": 0.2,  # noise std zC/K = 0.05 per parameter: the body still learns
    }
    simulate(overrides, num_supernodes=4)
    run_dir = tmp_path / "certified"
    summary = json.loads((run_dir / "certified_summary.json").read_text())
    # One core, two paths: the head trained from the clients' sums is the centralized head.
    assert summary["central_relative_difference"] <= 1e-6
    assert summary["test_accuracy_trained"] > 0.5
    assert summary["requests"] == 13
    # Clients keep their features between queries: the body is resent only when a query lands on a
    # simulation worker that has not yet seen that client, never once per request (~250 messages).
    # Ray places the retry on either worker, so a worker can miss a client more than once: 16 to 28
    # resends were seen; without the cache every query would carry the body.
    assert summary["messages"] > 100
    assert summary["model_resends"] <= summary["messages"] / 4

    ledger = read_ledger(run_dir / "certified_removal.jsonl")
    assert [c["kind"] for c in ledger] == ["train"] + ["remove"] * 13
    for certificate in ledger:
        assert certificate["certified"] and certificate["beta_after"] <= certificate["budget"]
        # Theorem 5: the DP body's guarantee composes with the head's.
        assert (
            certificate["dp_epsilon"] == pytest.approx(summary["dp_epsilon"])
            and summary["dp_epsilon"] > 0
        )
        assert certificate["total_epsilon"] == pytest.approx(summary["dp_epsilon"] + 1.0)
        assert certificate["total_delta"] == pytest.approx(1e-5 + 1e-4)
    singles = ledger[1:13]
    assert all(len(c["ids"]) == 1 and len(c["ids"][0]) == 2 for c in singles)
    assert len({tuple(c["ids"][0]) for c in singles}) == 12
    assert all(c["ids"][0][0] != 2 for c in singles)  # client 2 goes whole, at the end
    whole = ledger[-1]
    assert {pid for pid, _ in whole["ids"]} == {2}
    assert whole["n_after"] == whole["n_before"] - whole["removed"]
    assert [c["n_before"] - c["n_after"] for c in singles] == [1] * 12

    table = pd.read_csv(run_dir / "certified_removal.csv")
    assert list(table["requests"]) == [0, 4, 8, 12, 13]
    assert (table["beta"] <= table["budget"]).all()
    assert (run_dir / "certified_removal.png").stat().st_size > 0

    # The published head is the last certificate's weights, by their hash.
    with safe_open(str(run_dir / "certified_head.safetensors"), framework="numpy") as saved:
        final = saved.get_tensor("certified_head.weights")
    assert weights_sha256(final) == ledger[-1]["weights_sha256"]
    # One b per training (the trained head and the central check share the first).
    assert len(drawn) == 1 + summary["retrains"] and len(trained) == 2
    _nothing_written_determines_b(run_dir, overrides, drawn, trained, final)


def _decimal_texts(values):
    """Each value's 6-significant-digit text, where it has all six digits (a shorter text, like
    0.1234 for 0.12340004, could match an unrelated number in a table)."""
    texts = set()
    for value in np.abs(values).ravel():
        text = f"{value:.6g}"
        if len(re.sub(r"[^0-9]", "", text.split("e")[0]).lstrip("0")) == 6:
            texts.add(text)
    return texts


def _encodings_found(secret, blob: bytes) -> int:
    """How many of the secret's entries (float64) or neighbouring pairs of entries (float32), little-
    or big-endian, occur at any byte offset of ``blob``."""
    flat = np.asarray(secret, dtype=np.float64).ravel()
    pairs = np.stack([flat[:-1], flat[1:]], axis=1)
    encoded = [flat.astype(f"{o}f8").tobytes() for o in "<>"]
    encoded += [pairs.astype(f"{o}f4").tobytes() for o in "<>"]
    targets = np.concatenate([np.frombuffer(e, dtype="<u8") for e in encoded])
    found = 0
    for offset in range(8):
        words = (len(blob) - offset) // 8
        if words > 0:
            window = np.frombuffer(blob, dtype="<u8", count=words, offset=offset)
            found += int(np.isin(window, targets).sum())
    return found


def _head_tensors(files, shape):
    found = {}
    for path in files:
        if path.suffix == ".safetensors":
            with safe_open(str(path), framework="numpy") as opened:
                for key in opened.keys():
                    if tuple(opened.get_slice(key).get_shape()) == shape:
                        found[(path.name, key)] = opened.get_tensor(key).astype(np.float64)
    return found


def _implied_perturbation(run_dir, overrides, weights):
    """b' = -grad L(w; D) - lambda |D| w on the whole training data D (every client's features on
    the final body): exactly b for the head trained with b, before any removal."""
    from safetensors.torch import load_file

    from fedunlearn.certified.features import head_features
    from fedunlearn.certified.losses import one_vs_rest_targets
    from fedunlearn.certified.statistics import head_sums
    from fedunlearn.config import ExperimentConfig
    from fedunlearn.data.federated_data import load_federated_data
    from fedunlearn.training.models import build_dataset_model

    config = ExperimentConfig.from_run_config(overrides)
    data = load_federated_data(config)
    splits = data.splits
    model = build_dataset_model(
        config.model, config.dataset, splits.input_shape, splits.num_classes
    )
    model.load_state_dict(load_file(str(run_dir / "model_final.safetensors")))
    clients = range(config.num_clients)
    x = np.vstack([head_features(model, data.client_split(p).x) for p in clients])
    y = np.concatenate([data.client_split(p).y.numpy() for p in clients])
    t = one_vs_rest_targets(y, list(range(splits.num_classes)))
    gradient = head_sums(config.certified_loss, x, t, weights, hessian=False).gradient
    return -gradient - config.certified_lambda * len(x) * weights


def _nothing_written_determines_b(run_dir, overrides, drawn, trained, final):
    files = [path for path in sorted(run_dir.rglob("*")) if path.is_file()]
    blob = b"".join(path.read_bytes() for path in files)
    assert not (run_dir / "certified_head_trained.safetensors").exists()
    for secret in drawn + trained:
        assert _encodings_found(secret, blob) == 0, "b or a trained head is on disk"
    text = blob.decode("latin-1")
    for b in drawn:
        for token in _decimal_texts(b):
            assert not re.search(rf"(?<![0-9.]){re.escape(token)}(?![0-9])", text), token
    # The only (K, d) tensor on disk is the final head, and it does not give b away.
    heads = _head_tensors(files, final.shape)
    assert list(heads) == [("certified_head.safetensors", "certified_head.weights")]
    # The check's own power: the trained head's implied b' is b itself.
    exact = _implied_perturbation(run_dir, overrides, trained[0])
    assert np.linalg.norm(exact - drawn[0]) <= 1e-6 * np.linalg.norm(drawn[0])
    # The final head and D give b only up to an error far above the residual the certificate
    # hides (at most the budget): an attacker learns nothing of that residual from it.
    budget = json.loads((run_dir / "certified_summary.json").read_text())["budget"]
    for weights in heads.values():
        implied = _implied_perturbation(run_dir, overrides, weights)
        for b in drawn:
            assert np.linalg.norm(implied - b) >= 10 * budget
