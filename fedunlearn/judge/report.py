"""The judge's table, its verdict and its files (``judge.csv``, ``judge.md``, ``judge_rmia.csv``,
``judge.png``).

One row per population in the order original, methods, ``fedretrain``, ``retrain-independent``;
every registered metric's columns (:data:`fedunlearn.registry.JUDGE_METRICS`) with ``<col>-low``
and ``<col>-high`` beside each. The table ranks methods only when the floor (original) and the
ceiling (retrain against retrain) are told apart: their F intervals must not overlap
(:func:`separated`); otherwise the setting carries no signal and no ranking is printed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from fedunlearn.judge.forgetting_score import challenge_confidence, per_example_epsilons
from fedunlearn.judge.metrics import (
    comparison_population,
    rmia_population_scores,
    rmia_reference_sweep,
)
from fedunlearn.judge.populations import INDEPENDENT, ORIGINAL, REFERENCE, JudgeData
from fedunlearn.membership.metrics import roc_points
from fedunlearn.plots import (
    display_name,
    integer_ticks,
    labelled_bars,
    legend_outside,
    method_colour,
    save_figure,
)
from fedunlearn.registry import JUDGE_METRICS
from fedunlearn.store.durable_io import atomic_write_bytes
from fedunlearn.unlearning.forgetting import Signal

NO_SIGNAL = "no signal in this setting"


def population_order(data: JudgeData) -> list[str]:
    """original, the methods (in the data's order), fedretrain, retrain-independent."""
    fixed = (ORIGINAL, REFERENCE, INDEPENDENT)
    methods = [name for name in data.populations if name not in fixed]
    return [ORIGINAL, *methods, REFERENCE, INDEPENDENT]


def judge_table(
    data: JudgeData,
    metrics: list[str] | None = None,
    rng: np.random.Generator | None = None,
    progress: Callable[[str], None] | None = None,
) -> pd.DataFrame:
    """Every metric (registered names, all by default) on every population: a ``population``
    column, then per metric column its value, ``-low`` and ``-high`` (95% bootstrap interval).
    ``progress(line)`` hears of each population as its tests start."""
    rng = np.random.default_rng(0) if rng is None else rng
    specs = [JUDGE_METRICS[name] for name in (metrics or JUDGE_METRICS.names())]
    rows = []
    order = population_order(data)
    for index, population in enumerate(order, start=1):
        if progress is not None:
            progress(f"testing {population} ({index}/{len(order)})")
        row: dict[str, object] = {"population": population}
        for spec in specs:
            for column, estimate in spec.resolve()(data, population, rng).items():
                row.update(
                    {
                        column: estimate.value,
                        f"{column}-low": estimate.low,
                        f"{column}-high": estimate.high,
                    }
                )
        rows.append(row)
    return pd.DataFrame(rows)


def separated(table: pd.DataFrame) -> bool:
    """Whether F's 95% interval of ``original`` (floor) lies wholly below that of
    ``retrain-independent`` (ceiling): the setting can tell a model that forgot nothing from one
    that never saw D_f."""
    rows = table.set_index("population")
    floor, ceiling = rows.loc[ORIGINAL], rows.loc[INDEPENDENT]
    bounds = [floor["f-low"], floor["f-high"], ceiling["f-low"], ceiling["f-high"]]
    if not np.all(np.isfinite(np.asarray(bounds, dtype=float))):
        return False
    # Only a floor *below* the ceiling is a signal: an original that is no easier to tell from
    # retrained models than retrained models are from each other says nothing about forgetting.
    return bool(floor["f-high"] < ceiling["f-low"])


#: A method's verdict (:func:`judge_verdicts`).
INDISTINGUISHABLE = "indistinguishable from retraining"
DISTINGUISHABLE = "distinguishable from retraining"


def _side(rows: pd.DataFrame, population: str, column: str) -> int | None:
    """Where ``population``'s 95% interval of ``column`` lies against retrain-independent's:
    -1 wholly below, +1 wholly above, 0 overlapping (None: the column is missing or an interval
    is not finite)."""
    low, high = f"{column}-low", f"{column}-high"
    if column not in rows.columns or low not in rows.columns:
        return None
    bounds = [rows.loc[p, k] for p in (population, INDEPENDENT) for k in (low, high)]
    if not np.all(np.isfinite(np.asarray(bounds, dtype=float))):
        return None
    if bounds[1] < bounds[2]:
        return -1
    return 1 if bounds[0] > bounds[3] else 0


def judge_verdicts(table: pd.DataFrame) -> dict[str, dict[str, object]]:
    """Per method (every population but original, fedretrain and retrain-independent), what one
    judge run says of it, against retrain-independent (models retrained without the target from
    other seeds: how far retraining itself is from FedRetrain):

    * ``verdict``: :data:`DISTINGUISHABLE` when the attacks tell it from FedRetrain better than
      they tell retrain-independent (F's 95% interval wholly below retrain-independent's, or
      U-LiRA's accuracy wholly above it); else :data:`INDISTINGUISHABLE`; :data:`NO_SIGNAL` when
      the setting does not separate the original from retraining;
    * ``closer``: indistinguishable and even closer to FedRetrain than retrain-independent is (F
      above, or U-LiRA below its interval): methods that retrain from FedRetrain's own initial
      model and batch order (FedRecover, SIFU from round 1) are coupled to it;
    * ``f``, ``ulira``: the two sides (-1, 0, +1; :func:`_side`);
    * ``backdoor_removed``: its backdoor success interval reaches down to retrain-independent's
      (None without a backdoor column, or when the backdoor cannot measure forgetting:
      ``backdoor_problem`` says why, :func:`backdoor_problem`)."""
    rows = table.set_index("population")
    fixed = {ORIGINAL, REFERENCE, INDEPENDENT}
    signal = separated(table)
    problem = backdoor_problem(table)
    out = {}
    for population in rows.index:
        if population in fixed:
            continue
        f, ulira = _side(rows, population, "f"), _side(rows, population, "ulira-accuracy")
        backdoor = None
        if (
            not problem
            and "backdoor-success-low" in rows.columns
            and np.isfinite(rows.loc[population, "backdoor-success-low"])
        ):
            backdoor = bool(
                rows.loc[population, "backdoor-success-low"]
                <= rows.loc[INDEPENDENT, "backdoor-success-high"]
            )
        told_apart = f in (-1, None) or ulira == 1
        verdict = DISTINGUISHABLE if told_apart else INDISTINGUISHABLE
        out[population] = {
            "verdict": verdict if signal else NO_SIGNAL,
            "closer": signal and not told_apart and (f == 1 or ulira == -1),
            "f": f,
            "ulira": ulira,
            "backdoor_removed": backdoor,
            "backdoor_problem": problem,
        }
    return out


def backdoor_problem(table: pd.DataFrame) -> str:
    """Why the judge's backdoor cannot tell whether a method removed it (``""``: it can, or the
    run has no backdoor): the original learned it less than
    :data:`fedunlearn.unlearning.forgetting.MIN_SIGNAL_POINTS` points above FedRetrain (the
    suite's rule, :class:`fedunlearn.unlearning.forgetting.Signal`), so "removed" would hold for
    any model."""
    if "backdoor-success" not in table.columns:
        return ""
    rows = table.set_index("population")["backdoor-success"]
    if ORIGINAL not in rows.index or REFERENCE not in rows.index:
        return ""
    original, reference = float(rows[ORIGINAL]), float(rows[REFERENCE])
    if not (np.isfinite(original) and np.isfinite(reference)):
        return ""
    return Signal(original=original, reference=reference).problem()


def _value_columns(table: pd.DataFrame) -> list[str]:
    return [c for c in table.columns[1:] if not c.endswith(("-low", "-high"))]


def judge_markdown(table: pd.DataFrame) -> str:
    """``judge.md``: "value [low, high]" cells, then the verdict (a ranking by final score, or
    :data:`NO_SIGNAL`)."""
    columns = _value_columns(table)
    lines = [
        "| population | " + " | ".join(columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for _, row in table.iterrows():
        cells = [
            "n/a"
            if not np.isfinite(row[c])
            else f"{row[c]:.3g} [{row[f'{c}-low']:.3g}, {row[f'{c}-high']:.3g}]"
            for c in columns
        ]
        lines.append(f"| {row['population']} | " + " | ".join(cells) + " |")
    lines.append("")
    if not separated(table):
        lines.append(f"**{NO_SIGNAL}**: F(original) and F(retrain-independent) overlap.")
        return "\n".join(lines) + "\n"
    lines.append(
        "Verdicts of this training seed (F and U-LiRA intervals against retrain-independent's: "
        "distinguishable when the attacks tell a method from fedretrain better than they tell "
        "retraining from other seeds; "
        "a verdict that should hold for a method needs several seeds: "
        "`python -m simulations.benchmarks.repeat CONFIG --seeds 3`):"
    )
    backdoor = {True: "; backdoor removed", False: "; backdoor NOT removed", None: ""}
    problem = backdoor_problem(table)
    if problem:
        lines.append(f"- the backdoor cannot tell whether a method removed it: {problem}")
    for population, verdict in judge_verdicts(table).items():
        closer = (
            " (closer to fedretrain than retraining from other seeds)" if verdict["closer"] else ""
        )
        lines.append(
            f"- {population}: {verdict['verdict']}{closer}{backdoor[verdict['backdoor_removed']]}"
        )
    lines.append("")
    fixed = {ORIGINAL, REFERENCE, INDEPENDENT}
    methods = table[~table["population"].isin(fixed)]
    if "final-score" in table and len(methods):
        ranked = methods.sort_values("final-score", ascending=False)
        lines.append("Methods ranked by final score (higher forgets better):")
        lines += [
            f"{i}. {row['population']} ({row['final-score']:.3g})"
            for i, (_, row) in enumerate(ranked.iterrows(), start=1)
        ]
    return "\n".join(lines) + "\n"


def judge_figure(data: JudgeData, table: pd.DataFrame):
    """Per-example ε histograms per population, backdoor success with intervals, and RMIA's ROC
    on log-log axes (Carlini et al. 2022's convention), side by side."""
    import matplotlib.pyplot as plt

    order = population_order(data)
    fig, (ax_eps, ax_backdoor, ax_roc) = plt.subplots(1, 3, figsize=(16, 4.2))
    bins = np.linspace(0.0, 6.0, 25)
    for population in order:
        p, c = data[population], data[comparison_population(population)]
        eps = per_example_epsilons(
            challenge_confidence(p.forget_logits, p.forget_labels),
            challenge_confidence(c.forget_logits, c.forget_labels),
        )
        colour, name = method_colour(population), display_name(population)
        ax_eps.hist(np.minimum(eps, bins[-1]), bins=bins, histtype="step", color=colour, label=name)
        fpr, tpr = roc_points(*(np.ravel(s) for s in rmia_population_scores(data, population)))
        ax_roc.plot(np.maximum(fpr, 1e-5), np.maximum(tpr, 1e-5), color=colour, label=name)
    ax_eps.set(
        xlabel="per-example ε (forget set, capped at 6)",
        ylabel="examples",
        title="ε against retraining (low: forgotten)",
    )
    integer_ticks(ax_eps, "y")
    legend_outside(ax_eps)
    rows = table.set_index("population").loc[order]
    if "backdoor-success" in rows and np.isfinite(rows["backdoor-success"]).any():
        heights = rows["backdoor-success"].to_numpy(dtype=float)
        errors = np.abs(
            rows[["backdoor-success-low", "backdoor-success-high"]].to_numpy().T - heights
        )
        colours = [method_colour(p) for p in order]
        labelled_bars(ax_backdoor, range(len(order)), heights, fmt="{:.2f}", color=colours)
        ax_backdoor.errorbar(
            range(len(order)),
            heights,
            yerr=np.nan_to_num(errors),
            fmt="none",
            ecolor="black",
            capsize=3,
        )
        ax_backdoor.set_ylim(0, 1.15)
    else:
        ax_backdoor.text(
            0.5, 0.5, "no backdoor planted", ha="center", transform=ax_backdoor.transAxes
        )
    crowded = len(order) > 8  # every method and keep-training: steeper, smaller names
    ax_backdoor.set_xticks(
        range(len(order)),
        [display_name(p) for p in order],
        rotation=60 if crowded else 30,
        ha="right",
        rotation_mode="anchor",
        fontsize=8 if crowded else None,
    )
    ax_backdoor.set(ylabel="backdoor success", title="triggered test samples, other classes")
    ax_roc.plot([1e-5, 1], [1e-5, 1], color="gray", linestyle=":", label="chance")
    ax_roc.set(
        xscale="log",
        yscale="log",
        xlabel="false-positive rate",
        ylabel="true-positive rate",
        title="RMIA, forget set vs population data",
    )
    legend_outside(ax_roc)
    return fig


def write_judge_report(data: JudgeData, table: pd.DataFrame, directory: Path) -> dict[str, Path]:
    """Write ``judge.csv``, ``judge.md``, ``judge_rmia.csv`` (RMIA per number of reference models,
    every population) and ``judge.png`` into ``directory``; returns their paths by name."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = {name: directory / name for name in ("judge.csv", "judge.md", "judge_rmia.csv")}
    atomic_write_bytes(paths["judge.csv"], table.to_csv(index=False).encode())
    atomic_write_bytes(paths["judge.md"], judge_markdown(table).encode())
    sweep = [row for p in population_order(data) for row in rmia_reference_sweep(data, p)]
    atomic_write_bytes(paths["judge_rmia.csv"], pd.DataFrame(sweep).to_csv(index=False).encode())
    paths["judge.png"] = save_figure(judge_figure(data, table), directory / "judge.png")
    return paths
