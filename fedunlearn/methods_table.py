"""The unlearning methods side by side (``fedunlearn methods``, docs/baselines.md), read from the
registry's entries."""

from __future__ import annotations

from fedunlearn.registry import UNLEARNING


def methods_table():
    """One row per unlearning method (``fedunlearn methods``, docs/baselines.md): whether the run
    lists it by default, what its policy keeps during training, the aggregations its math assumes,
    whether it runs with clients sampled per round, whether it goes on when remaining clients
    are offline at the request (a method that messages no client always does), whether the leaving client works during the
    request, and what it is."""
    import pandas as pd

    rows = []
    for spec in UNLEARNING:
        policy = spec.policy()
        rows.append(
            {
                "method": spec.name,
                "default": "yes" if spec.default else "",
                "keeps during training": policy.name if policy is not None else "",
                "aggregations": ", ".join(spec.aggregations or ("any",)),
                "sampled rounds": "yes" if spec.sampling else "",
                "clients offline at the request": "goes on"
                if spec.offline or not spec.messages
                else "refused",
                "leaving client works": "yes (allow-target-participation)"
                if spec.target_participates
                else "",
                "what it does": spec.description,
            }
        )
    return pd.DataFrame(rows)
