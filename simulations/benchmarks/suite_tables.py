"""The suite's tables and figures (:mod:`simulations.benchmarks.suite`), from the run directories
it left: every row of every run with its keys, gap to FedRetrain and forgetting verdict
(``suite.csv``); per regime and method, how often it was flagged and why, its gap per partition and
whether it forgot as FedRetrain and beyond keep-training (``suite.md``); per setting, over seeds;
the points without a result; one figure per regime (``suite_<regime>.png``: gap and backdoor left
against cost) and one across regimes (``suite_regimes.png``).

Flags are counted by reason: ``accuracy`` (more than ``flag-gap`` points below FedRetrain),
``forgetting`` (kept the backdoor, or forgot nothing), ``not measurable`` (the signal could not
tell) and ``diverged``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from fedunlearn.plots import display_name, legend_outside, method_colour, save_figure  # noqa: E402
from fedunlearn.unlearning.forgetting import (  # noqa: E402
    AS_REFERENCE,
    FORGOT_NOTHING,
    KEPT_PART,
    NOT_MEASURABLE,
)
from simulations.benchmarks.repeat import comparison_summary, with_gaps  # noqa: E402

KEYS = ("regime", "dataset", "partition", "seed")
REFUSED = "refused.json"
REFERENCES = ("fedavg", "fedretrain")
#: The flag reasons counted apart, by how a flag begins (anything else: accuracy).
FLAG_KINDS = (
    ("diverged", "diverged"),
    ("forgetting not measurable", "not measurable"),
    ("kept the attack", "forgetting"),
    ("forgot nothing", "forgetting"),
)
#: Forgetting more than keep-training counts beyond this many points of backdoor success.
BEYOND_POINTS = 5.0


def flag_kind(flag: str) -> str:
    """``""`` (no flag), or which of accuracy / forgetting / not measurable / diverged."""
    if not flag:
        return ""
    return next((kind for start, kind in FLAG_KINDS if flag.startswith(start)), "accuracy")


def with_signal_columns(long: pd.DataFrame, keys) -> pd.DataFrame:
    """Rows of several comparisons (told apart by ``keys``) with the flag as text, its kind
    (:func:`flag_kind`), the forgetting verdict as text, and the backdoor's success above
    FedRetrain's of the same comparison in points (``backdoor_above_points``)."""
    long = long.copy()
    long["flag"] = long["flag"].fillna("").astype(str)
    long["flag_kind"] = [flag_kind(f) for f in long["flag"]]
    if "forgetting" not in long:
        long["forgetting"] = ""
    long["forgetting"] = long["forgetting"].fillna("").astype(str)
    retrained = long[long["method"] == "fedretrain"].set_index(list(keys))["attack_success"]
    index = pd.MultiIndex.from_frame(long[list(keys)])
    long["backdoor_above_points"] = 100 * (
        long["attack_success"].to_numpy() - retrained.reindex(index).to_numpy()
    )
    return long


def record_refused(output: Path, refused: dict[str, str]) -> dict[str, str]:
    """``refused`` merged into the output folder's record of refused points; the whole record."""
    path = output / REFUSED
    known = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    known.update(refused)
    output.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(known, indent=1, sort_keys=True), encoding="utf-8")
    return known


def collect(output: Path, chosen) -> pd.DataFrame:
    """Every finished point's rows, with its keys, the gap to FedRetrain, the epochs share and
    the flag's kind; an empty table when none finished."""
    tables = []
    for point in chosen:
        path = output / point.regime / point.name / "unlearning.csv"
        if path.is_file():
            table = pd.read_csv(path)
            keys = dict(zip(KEYS, (point.regime, point.dataset, point.partition, point.seed)))
            tables.append(table.assign(**keys))
    if not tables:
        return pd.DataFrame(columns=[*KEYS, "method"])
    long = with_signal_columns(with_gaps(pd.concat(tables, ignore_index=True), KEYS), KEYS)
    front = [*KEYS, "method", "test_accuracy", "gap_points", "attack_success",
             "backdoor_above_points", "forgetting", "client_epochs", "client_epochs_share", "did",
             "flag", "flag_kind"]  # fmt: skip
    front = [c for c in front if c in long]
    return long[front + [c for c in long.columns if c not in front]]


def by_method(long: pd.DataFrame) -> pd.DataFrame:
    """Per regime and method (the original and FedRetrain left out): how many runs flagged it
    and for what, its gap to FedRetrain per partition (mean over datasets and seeds, and the worst
    run), in how many runs it forgot as FedRetrain and in how many it forgot more than
    keep-training at its own cost (by more than :data:`BEYOND_POINTS` of backdoor success), both
    over the runs where forgetting was measurable and the method kept its accuracy
    (:func:`_useful`), the
    accuracy the remaining client that lost most lost against the original (points, mean and
    worst run), and its client-epochs share of FedRetrain's."""
    rows = long[~long["method"].isin(REFERENCES)]
    table = []
    for (regime, method), part in rows.groupby(["regime", "method"], sort=False):
        row = {"regime": regime, "method": method, "flagged": _flag_count(part)}
        for partition, gaps in part.groupby("partition", sort=False)["gap_points"]:
            row[f"gap {partition}"] = f"{gaps.mean():+.2f} (worst {gaps.min():+.1f})"
        row["forgot as fedretrain"] = _forgot_count(part)
        row["beyond keep-training"] = _beyond_count(part, method)
        if "worst_client_drop" in part:
            drops = part["worst_client_drop"]
            row["worst client drop"] = f"{drops.mean():.1f} (worst {drops.max():.1f})"
        row["client-epochs share"] = f"{part['client_epochs_share'].mean():.2f}"
        table.append(row)
    return pd.DataFrame(table)


def _flag_count(part: pd.DataFrame) -> str:
    kinds = part["flag_kind"].value_counts()
    flagged = int((part["flag_kind"] != "").sum())
    why = ", ".join(f"{kinds[k]} {k}" for k in ("accuracy", "forgetting", "not measurable",
                                                 "diverged") if k in kinds)  # fmt: skip
    return f"{flagged} of {len(part)}" + (f" ({why})" if why else "")


def _useful(part: pd.DataFrame) -> pd.DataFrame:
    """The runs whose forgetting is worth counting: measurable, and the method kept its accuracy
    (flagged for forgetting or not at all: a model that collapsed forgets trivially)."""
    measurable = part["forgetting"].isin([AS_REFERENCE, KEPT_PART, FORGOT_NOTHING])
    return part[measurable & part["flag_kind"].isin(["", "forgetting"])]


def _forgot_count(part: pd.DataFrame) -> str:
    useful = _useful(part)
    same = int((useful["forgetting"] == AS_REFERENCE).sum())
    return f"{same} of {len(useful)}" if len(useful) else "none measurable"


def _beyond_count(part: pd.DataFrame, method: str) -> str:
    if method == "keep-training" or "forgot_beyond_keep_training" not in part:
        return ""
    beyond = _useful(part)["forgot_beyond_keep_training"].dropna()
    if beyond.empty:
        return "none measurable"
    return f"{int((beyond > BEYOND_POINTS).sum())} of {len(beyond)} (mean {beyond.mean():+.1f})"


def settings(long: pd.DataFrame) -> pd.DataFrame:
    """Per regime, dataset, partition and method: :func:`comparison_summary` over seeds, with the
    backdoor's success (mean) and each seed's forgetting verdict."""
    rows = long[long["method"] != "fedavg"]
    table = comparison_summary(rows, ["regime", "dataset", "partition"])
    keys = ["regime", "dataset", "partition", "method"]
    grouped = rows.groupby(keys, sort=False)
    if "attack_success" in rows:
        table["backdoor"] = [f"{v:.3f}" for v in grouped["attack_success"].mean()]
    table["forgetting per seed"] = [
        ", ".join(f"s{s}: {f or '-'}" for s, f in zip(part["seed"], part["forgetting"]))
        for _, part in grouped
    ]
    return table


def points_note(long: pd.DataFrame, chosen, refused: dict[str, str] | None = None) -> str:
    """Markdown lines naming every chosen point refused (with why), every point without a
    result (failed or not run yet) and every point whose original training is flagged."""
    refused = {k: v for k, v in (refused or {}).items() if k in {p.label for p in chosen}}
    done = set(zip(*(long[k] for k in KEYS))) if len(long) else set()
    missing = [p.label for p in chosen
               if (p.regime, p.dataset, p.partition, p.seed) not in done
               and p.label not in refused]  # fmt: skip
    lines = [f"Refused ({len(refused)} of {len(chosen)} points), never a pass:"] * bool(refused)
    lines += [f"- {label}: {why}" for label, why in sorted(refused.items())]
    lines += [f"No result ({len(missing)} of {len(chosen)} points): {', '.join(missing)}."] * bool(
        missing
    )
    originals = long[(long["method"] == "fedavg") & (long["flag"] != "")] if len(long) else long
    lines += [
        f"{r}/{d}-{p}-s{s}: the original is flagged ({f}); its rows mean little."
        for r, d, p, s, f in originals[[*KEYS, "flag"]].itertuples(index=False)
    ]
    return "".join(f"\n{line}\n" for line in lines)


MARKERS = {"iid": "o", "dirichlet-0.5": "s", "dirichlet-0.1": "^", "shards": "D"}


def symlog_gaps(ax, values) -> None:
    """A symlog axis for gaps in points, with ticks a reader can read."""
    low = min([*values, -5.0])
    high = max([*values, 5.0])
    ax.set_yscale("symlog", linthresh=2)
    ticks = [v for v in (-100, -50, -20, -10, -5, -2, 0, 2, 5, 10) if low * 1.05 <= v <= high * 1.3]
    ax.set_yticks(ticks, [f"{v:+d}" if v else "0" for v in ticks])
    ax.set_ylim(low * 1.3, high * 1.3)


def regime_figure(long: pd.DataFrame, regime: str):
    """Two panels, one point per method and setting (dataset, partition; mean over seeds),
    colour per method, marker per partition, against client-epochs as a share of FedRetrain's:
    the test-accuracy gap to FedRetrain (symlog), and the backdoor's success above FedRetrain's
    (points; the runs where forgetting was measurable). A point flagged for accuracy or
    forgetting at any seed is ringed in red."""
    rows = long[(long["regime"] == regime) & ~long["method"].isin(REFERENCES)]
    rows = rows.assign(
        left=rows["backdoor_above_points"].where(rows["forgetting"] != NOT_MEASURABLE),
        bad=rows["flag_kind"].isin(["accuracy", "forgetting", "diverged"]),
    )
    means = rows.groupby(["dataset", "partition", "method"], sort=False).agg(
        gap=("gap_points", "mean"),
        share=("client_epochs_share", "mean"),
        left=("left", "mean"),
        flagged=("bad", "sum"),
    )
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2))
    colours = {m: method_colour(m) for m in rows["method"].unique()}
    for ax, column in zip(axes, ("gap", "left")):
        for (_, partition, method), point in means.iterrows():
            if not math.isfinite(point[column]):
                continue
            ax.scatter(point["share"], point[column], color=colours[method], s=40, alpha=0.85,
                       marker=MARKERS.get(partition, "o"), zorder=3)  # fmt: skip
            if point["flagged"]:
                ax.scatter(point["share"], point[column], s=150, facecolors="none",
                           edgecolors="tab:red", linewidths=1.2, zorder=4)  # fmt: skip
        ax.axhline(0, color="black", linewidth=0.8)
        ax.axvline(1, color="grey", linewidth=0.8, linestyle=":")
        ax.grid(alpha=0.3, which="both")
        ax.set_xlabel("client-epochs, share of FedRetrain's (1 = as costly as retraining)")
    symlog_gaps(axes[0], [v for v in means["gap"] if math.isfinite(v)])
    axes[0].set_ylabel("test accuracy gap to FedRetrain (points, symlog)")
    axes[0].set_title("utility: below 0 = accuracy lost")
    axes[1].set_ylabel("backdoor success above FedRetrain's (points)")
    axes[1].set_title("forgetting (measurable runs): 0 = forgot as retraining does")
    handles = [plt.Line2D([], [], color=c, marker="o", linestyle="", label=display_name(m))
               for m, c in colours.items()]  # fmt: skip
    handles += [plt.Line2D([], [], color="grey", marker=k, linestyle="", label=p)
                for p, k in MARKERS.items() if p in set(rows["partition"])]  # fmt: skip
    handles.append(plt.Line2D([], [], marker="o", markerfacecolor="none", markeredgecolor="tab:red",
                              linestyle="", markersize=10, label="flagged at a seed"))  # fmt: skip
    legend_outside(axes[1], handles=handles)
    fig.suptitle(f"every client-removal method, {regime} regime: mean over seeds per setting")
    return fig


def regimes_figure(long: pd.DataFrame):
    """Per method, its mean gap to FedRetrain (left) and its share of runs flagged for accuracy,
    forgetting or divergence (right; "not measurable" is the setting's, not the method's) in each
    regime, side by side: which methods need the papers' training."""
    rows = long[~long["method"].isin(REFERENCES)]
    regimes = list(dict.fromkeys(rows["regime"]))
    methods = list(dict.fromkeys(rows["method"]))
    gaps = rows.groupby(["method", "regime"])["gap_points"].mean()
    bad = rows["flag_kind"].isin(["accuracy", "forgetting", "diverged"])
    flagged = rows.assign(f=bad).groupby(["method", "regime"])["f"].mean()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6))
    width = 0.8 / max(1, len(regimes))
    for r, regime in enumerate(regimes):
        x = [i + (r - (len(regimes) - 1) / 2) * width for i in range(len(methods))]
        hatch = "//" if r else ""
        colours = [method_colour(m) for m in methods]
        for ax, values in zip(axes, (gaps, 100 * flagged)):
            heights = [values.get((m, regime), math.nan) for m in methods]
            ax.bar(x, heights, width=width, color=colours, hatch=hatch, edgecolor="white",
                   label=regime)  # fmt: skip
    for ax in axes:
        ax.set_xticks(range(len(methods)), [display_name(m) for m in methods], rotation=35,
                      ha="right")  # fmt: skip
        ax.grid(axis="y", alpha=0.3)
        ax.axhline(0, color="black", linewidth=0.8)
    symlog_gaps(axes[0], [v for v in gaps if math.isfinite(v)])
    axes[0].set_ylabel("mean gap to FedRetrain (points, symlog)")
    axes[1].set_ylabel("runs flagged for accuracy or forgetting (%)")
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor="lightgrey", hatch="//" if r else "",
                             edgecolor="white", label=f"{regime} regime")
               for r, regime in enumerate(regimes)]  # fmt: skip
    legend_outside(axes[1], handles=handles)
    fig.suptitle("each method in each training regime (plain: " + regimes[0] + ")")
    return fig


def write_suite(output: Path, chosen, refused: dict[str, str]) -> str:
    """Write ``suite.csv``, ``suite.md`` and the figures under ``output``; returns the markdown."""
    refused = record_refused(output, refused)
    long = collect(output, chosen)
    if long.empty:
        note = points_note(long, chosen, refused)
        (output / "suite.md").write_text(note, encoding="utf-8")
        return note
    long.to_csv(output / "suite.csv", index=False)
    markdown = (
        "Per regime and method, over every dataset and seed:\n\n"
        + by_method(long).to_markdown(index=False)
        + "\n\nPer setting, over seeds:\n\n"
        + settings(long).to_markdown(index=False)
        + "\n"
        + points_note(long, chosen, refused)
    )
    (output / "suite.md").write_text(markdown, encoding="utf-8")
    for regime in dict.fromkeys(long["regime"]):
        save_figure(regime_figure(long, regime), output / f"suite_{regime}.png")
    save_figure(regimes_figure(long), output / "suite_regimes.png")
    return markdown
