"""End to end, in process: the certified head as a server-side plug-in on a federated digits model.

Four virtual clients train a DP body (DP-FedAvg), the server trains the certified head from the
clients' sums, removes single samples and then a whole client, and writes a certificate per request.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from fedunlearn.certified_removal import read_ledger

pytestmark = pytest.mark.slow


def test_federated_certified_head_matches_central_and_certifies_every_request(tmp_path, simulate):
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
