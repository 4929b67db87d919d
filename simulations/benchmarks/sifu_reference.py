"""SIFU side by side with the authors' code (Fraboni et al., *Sequential Informed Federated
Unlearning*, AISTATS 2024; github.com/Accenture/Labs-Federated-Learning, branch ``SIFU``, commit
9a5529b) on their MNIST setting: the rollback round and the noise of each side, and the true
sensitivity that both claim to bound.

The shared setting is theirs (``list_exp_to_run.py``, MNIST block): ``MNIST-shard_0`` (M = 100
clients of 100 training images each, client i holding only digit i mod 10, drawn by their
``FL/read_db.py``), their ``LogisticRegression`` (784 -> 10), FedAvg sampling m = 10 clients a
round with equal weights, K = 10 local steps of SGD (lr 0.01, momentum 0.9, no weight decay,
gradient norm clipped at 0.5, their ``--clip`` default) on a batch of 100 = the client's whole
data, server learning rate 1; delta = 1/M (``FL/privacy.py``). Two deviations, both for time on
2 CPU cores: training stops after ``--rounds`` rounds (default 500; theirs runs until 93 % train
accuracy, about 1,000+ rounds here, at most 10^4), and three seeds rather than ten.

What runs, per seed:

(a) **Their code.** ``FU.py --unlearn_scheme train`` trains (unchanged; a launcher seeds Python,
    NumPy and torch, which it leaves unseeded). Their saved Psi history (``metric``) goes through
    their ``FL/privacy.py`` ``psi`` (the budget) and ``FL/branch.py`` ``Branch.update`` /
    ``get_T`` (the rollback) for every (epsilon, sigma) and forgetting request; for the
    ``--check`` pair, their ``FU.py --unlearn_scheme SIFU`` runs too and the branch it prints is
    recorded beside it. Their round index t (0 = the initial model) is our round n = t + 1.
(b) **Ours, on the same trajectory.** The training is replayed here from their client data,
    initial model (``torch.manual_seed(seed)``) and client sampling (``random.sample`` after
    ``random.seed(seed)``), step for step as their ``Client.local_work`` and
    ``Server.aggregation`` do; the script checks that the replay reproduces their Psi history and
    final model. Our :class:`~fedunlearn.unlearning.sensitivity.SensitivityAccumulator` observes every
    round: with the default ``expansion = "smoothness"`` (the bound under L, here the exact
    L = max_k lambda_max(X_k^T X_k / n_k) / 2 of softmax regression, bias included) and with
    ``expansion = "non-expansive"`` (the authors' factor as an option); our rollback is
    :func:`~fedunlearn.unlearning.sifu.rollback_round`.
(c) **The truth.** FedAvg replayed without the forgotten clients (same participants minus them,
    re-weighted): the distance ||theta^n - theta^n_{-I}|| at every round; a rollback is sound
    when the distance at the chosen round is within the budget. "Oracle" is the latest round
    where it is.

Every side is compared at the same budget Psi* = epsilon sigma / c, c = sqrt(2 ln(1.25 / delta))
(their ``psi``) and adds N(0, sigma^2) to every parameter (their ``noise_model``, our
``add_noise``). The budgets table adds what our default ``sifu-mechanism = analytic`` certifies at
the same sigma, and the delta that their classical constant really gives at epsilon >= 1
(Balle & Wang 2018, Theorem 8).

Usage::

    FEDUNLEARN_SIFU_REFERENCE_DIR=PATH FEDUNLEARN_DATA_ROOT=DIR \\
        python -m simulations.benchmarks.sifu_reference [--seeds 0 1 2] [--rounds 500]

``PATH`` is a checkout of their branch ``SIFU`` (nothing of it is in this repository, and it runs
unchanged, from a scratch copy); ``DIR`` holds ``MNIST/raw``. Writes ``sifu_reference.csv`` (one
row per seed, request, (epsilon, sigma) and side), ``sifu_reference_budgets.csv`` and
``sifu_reference.md`` to ``--output-dir``, their logs to ``--log-dir``.
"""

from __future__ import annotations

import argparse
import ast
import glob
import math
import os
import pickle
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from fedunlearn.unlearning.gaussian_mechanism import _analytic_delta, unlearning_budget
from fedunlearn.unlearning.sensitivity import SensitivityAccumulator, local_lipschitz
from fedunlearn.unlearning.sifu import rollback_round
from simulations.benchmarks import default_data_root
from simulations.benchmarks._args import common_args

SIMULATIONS = Path(__file__).resolve().parents[1]
REFERENCE_ENV = "FEDUNLEARN_SIFU_REFERENCE_DIR"
DATASET = "MNIST-shard_0"
#: Their MNIST setting (list_exp_to_run.py) and FU.py's defaults for what it does not set.
SETTING = dict(M=100, n_sampled=10, n_SGD=10, B=100, lr_l=0.01, lr_g=1.0, lambd=0.0, clip=0.5,
               momentum=0.9, stop_acc=93.0)  # fmt: skip
#: Their forgetting policies (policy.py): client 0 alone, and clients 0, 10, ..., 90 (digit 0).
TARGETS = {"P12": [0], "P70": [10 * i for i in range(10)]}
GRID = [(10.0, 0.005), (10.0, 0.01), (10.0, 0.05), (10.0, 0.2), (1.0, 0.05), (0.5, 0.1)]
SIDES = ("authors' code", "ours: smoothness bound (default)", "ours: non-expansive option",
         "oracle (true distance)")  # fmt: skip

# Runs FU.py as its __main__ after seeding every RNG it draws from (it seeds none itself).
_LAUNCHER = r"""
import random, runpy, sys
import numpy, torch
reference, seed, threads, argv = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
random.seed(seed); numpy.random.seed(seed); torch.manual_seed(seed)
torch.set_num_threads(threads)
sys.path.insert(0, reference)
sys.argv = [reference + "/FU.py", *argv]
runpy.run_path(reference + "/FU.py", run_name="__main__")
"""


# ------------------------------------------------------------------ their code
def prepare_scratch(reference: Path, data_root: Path, scratch: Path) -> Path:
    """A copy of their checkout to run in (it writes its data and results under its working
    directory), with ``data/MNIST`` linked to the local copy so torchvision downloads nothing,
    and the folder their ``--limit_train_iter`` runs save into (their branch lacks it)."""
    copy = scratch / "reference"
    shutil.copytree(reference, copy, ignore=shutil.ignore_patterns(".git"))
    (copy / "data").mkdir(exist_ok=True)
    (copy / "data" / "MNIST").symlink_to(data_root.resolve() / "MNIST")
    for kind in ("acc", "loss", "metric", "final_model"):
        (copy / "limit_iter_saved" / kind).mkdir(parents=True, exist_ok=True)
    return copy


def their_arguments(scheme, policy, rounds, epsilon, sigma, seed, extra=()) -> list[str]:
    s = SETTING
    return [
        "--dataset_name", DATASET, "--unlearn_scheme", scheme, "--forgetting", policy,
        "--T", str(rounds), "--n_SGD", str(s["n_SGD"]), "--B", str(s["B"]),
        "--lr_l", str(s["lr_l"]), "--lr_g", str(s["lr_g"]), "--M", str(s["M"]),
        "--n_sampled", str(s["n_sampled"]), "--lambd", str(s["lambd"]), "--clip", str(s["clip"]),
        "--stop_acc", str(s["stop_acc"]), "--epsilon", str(epsilon), "--sigma", str(sigma),
        "--seed", str(seed), "--device", "cpu", *extra,
    ]  # fmt: skip


def run_theirs(copy: Path, arguments: list[str], seed: int, threads: int, log: Path) -> float:
    environment = dict(os.environ, OMP_NUM_THREADS=str(threads))
    command = [sys.executable, "-c", _LAUNCHER, str(copy), str(seed), str(threads), *arguments]
    started = time.perf_counter()
    with open(log, "w") as output:
        done = subprocess.run(
            command, cwd=copy, env=environment, stdout=output, stderr=subprocess.STDOUT
        )
    if done.returncode != 0:
        raise SystemExit(f"their FU.py exited with {done.returncode}; see {log}")
    return time.perf_counter() - started


def their_outputs(copy: Path, epsilon: float, sigma: float, seed: int):
    """Their training's Psi history (1, R + 1, M) and final model, found by their file name."""
    pattern = f"FL_{DATASET}_train_*_e{epsilon}_sig{sigma}_s{seed}"
    found = glob.glob(str(copy / "saved_exp_info" / "metric" / f"{pattern}.pkl"))
    if len(found) != 1:
        raise SystemExit(f"expected one saved Psi history {pattern}.pkl, found {found}")
    name = Path(found[0]).stem
    with open(found[0], "rb") as handle:
        metric = pickle.load(handle)
    final = torch.load(copy / "saved_exp_info" / "final_model" / f"{name}.pth")
    return metric, final


def their_rollback(copy: Path, metric: np.ndarray, clients: list[int], epsilon, sigma):
    """Their budget and branch (FL/privacy.py psi, FL/branch.py Branch.update), imported from the
    scratch copy: the rollback index T_r and the model their forget_Wr loads: the last model
    within budget of the client of I with the largest Psi at T_r (Server.keep_best_model)."""
    if str(copy) not in sys.path:
        sys.path.insert(0, str(copy))
    from FL.branch import Branch
    from FL.privacy import psi

    budget = float(psi(sigma, epsilon, SETTING["M"]))
    branch = Branch()
    branch.update(metric, 1, list(clients), budget)
    index = int(branch()[-1][1])
    client = clients[int(np.argmax(metric[0, index, clients]))]
    loaded = int(np.max(np.where(metric[0, :, client] <= budget)[0]))
    return budget, branch(), index, loaded


def printed_branch(log: Path) -> list:
    found = re.findall(r"^branch (\[.*\])$", log.read_text(), flags=re.MULTILINE)
    return ast.literal_eval(re.sub(r"np\.\w+\((-?\d+)\)", r"\1", found[-1]))  # NumPy 2 reprs


# ------------------------------------------------------------------ the replay
def their_clients(copy: Path) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The clients' data as their read_db.py wrote it, with their transforms (ToTensor,
    Normalize(0.1307, 0.3081)), flattened as their LogisticRegression does."""
    with open(copy / "data" / f"{DATASET}_M{SETTING['M']}_train.pkl", "rb") as handle:
        images, labels = pickle.load(handle)
    xs = [
        ((torch.tensor(np.asarray(x), dtype=torch.float32) / 255.0 - 0.1307) / 0.3081).reshape(
            len(x), -1
        )
        for x in images
    ]
    return xs, [torch.tensor(np.asarray(y)).long() for y in labels]


def smoothness(xs: list[torch.Tensor]) -> float:
    """L of the full-batch mean cross-entropy of a linear softmax model: its Hessian is the mean
    of (diag(p) - p p^T) (x) (x~ x~^T) with diag(p) - p p^T <= I / 2, x~ = (x, 1)."""
    top = 0.0
    for x in xs:
        features = torch.cat([x, torch.ones(len(x), 1)], 1).double()
        top = max(top, float(torch.linalg.eigvalsh(features.T @ features / len(x))[-1]))
    return top / 2


def participant_sets(seed: int, rounds: int) -> list[list[int]]:
    """Their Server.sample_clients after random.seed(seed): random.sample of the kept clients."""
    draw = random.Random(seed)
    return [draw.sample(list(range(SETTING["M"])), SETTING["n_sampled"]) for _ in range(rounds)]


def local_work(state, x, y) -> dict[str, torch.Tensor]:
    """Their Client.local_work: K steps of SGD (momentum, weight decay) on the whole client batch
    (B >= its 100 samples), gradient norm clipped; a fresh optimizer every round."""
    s = SETTING
    model = nn.Linear(x.shape[1], 10)
    model.load_state_dict(state)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=s["lr_l"], momentum=s["momentum"], weight_decay=s["lambd"]
    )
    for _ in range(s["n_SGD"]):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        nn.utils.clip_grad_norm_(model.parameters(), s["clip"])
        optimizer.step()
    return {key: value.detach() for key, value in model.state_dict().items()}


def _vector(state) -> torch.Tensor:
    return torch.cat([state["weight"].reshape(-1), state["bias"]])


def replay(clients, initial, sets, excluded=frozenset(), observe=None):
    """FedAvg as their Server.aggregation computes it, without ``excluded`` (the rest of a round's
    participants re-weighted; a round with none left leaves the model as is). Returns theta^n
    (float64 vectors, n = 1 .. R + 1) and, without exclusions, their Psi formula recomputed."""
    xs, ys = clients
    state = {key: value.clone() for key, value in initial.items()}
    models, metric = [_vector(state).double()], np.zeros((len(sets) + 1, SETTING["M"]))
    removal = SETTING["lr_g"] * (1 / SETTING["M"]) / (1 - 1 / SETTING["M"])
    decay = (1 - SETTING["lr_l"] * SETTING["lambd"]) ** SETTING["n_SGD"]
    for t, chosen in enumerate(sets):
        kept = [k for k in chosen if k not in excluded]
        local = {k: local_work(state, xs[k], ys[k]) for k in kept}
        if observe is not None:
            updates = {
                k: {key: (local[k][key] - state[key]).double() for key in state} for k in kept
            }
            observe(t + 1, {key: v.double() for key, v in state.items()}, updates,
                    {k: len(xs[k]) for k in kept})  # fmt: skip
        if kept:
            weights = [1 / len(kept)] * len(kept)
            new = {
                key: value * (1 - SETTING["lr_g"] * np.sum(weights)) for key, value in state.items()
            }
            for k, weight in zip(kept, weights):
                for key in new:
                    new[key] = new[key] + SETTING["lr_g"] * weight * local[k][key]
            state = new
        models.append(_vector(state).double())
        metric[t + 1] = decay * metric[t]
        for k in kept:
            metric[t + 1, k] += removal * float(torch.norm(_vector(state) - _vector(local[k])))
    return models, metric, state


# ------------------------------------------------------------------ the comparison
def _with(accumulator: SensitivityAccumulator, **parameters) -> SensitivityAccumulator:
    saved = accumulator.to_json()
    saved["parameters"].update(parameters)
    return SensitivityAccumulator.from_json(saved)


def compare_seed(args, seed: int, copy: Path, log_dir: Path) -> tuple[list[dict], dict]:
    check_epsilon, check_sigma = args.check
    log = log_dir / f"train_s{seed}.log"
    arguments = their_arguments("train", "P0", args.rounds, check_epsilon, check_sigma, seed)
    print(f"=== seed {seed}: their FU.py {' '.join(arguments)}", flush=True)
    train_seconds = run_theirs(copy, arguments, seed, args.threads, log)
    metric, final = their_outputs(copy, check_epsilon, check_sigma, seed)
    rounds = metric.shape[1] - 1

    printed = {}
    for policy in args.targets:
        sifu_log = log_dir / f"sifu_{policy}_s{seed}.log"
        extra = ("--limit_train_iter", "0.01")  # the branch is printed before retraining
        arguments = their_arguments("SIFU", policy, args.rounds, check_epsilon, check_sigma,
                                    seed, extra)  # fmt: skip
        run_theirs(copy, arguments, seed, args.threads, sifu_log)
        printed[policy] = printed_branch(sifu_log)

    clients = their_clients(copy)
    torch.manual_seed(seed)  # their load_model
    initial = {
        key: value.detach().clone() for key, value in nn.Linear(784, 10).state_dict().items()
    }
    sets = participant_sets(seed, rounds)
    lipschitz = smoothness(clients[0])
    s = SETTING
    accumulator = SensitivityAccumulator(
        learning_rate=s["lr_l"], smoothness=lipschitz, local_steps=s["n_SGD"],
        momentum=s["momentum"], weight_decay=s["lambd"],
    )  # fmt: skip
    started = time.perf_counter()
    models, replayed, state = replay(clients, initial, sets, observe=accumulator.observe)
    replay_seconds = time.perf_counter() - started
    ours = {
        SIDES[1]: accumulator,
        SIDES[2]: _with(accumulator, expansion="non-expansive"),
    }
    check = {
        "seed": seed,
        "rounds": rounds,
        "their_train_seconds": round(train_seconds, 1),
        "replay_seconds": round(replay_seconds, 1),
        "replay_max_psi_difference": float(np.abs(replayed - metric[0]).max()),
        "replay_max_model_difference": float(
            max((state[k.replace("last.", "")] - v).abs().max() for k, v in final.items())
        ),
        "smoothness_L": lipschitz,
        "rho_smoothness": local_lipschitz(s["lr_l"], lipschitz, s["n_SGD"], momentum=s["momentum"]),
        "rho_non_expansive": abs(1 - s["lr_l"] * s["lambd"]) ** s["n_SGD"],
    }
    print(f"=== seed {seed}: {check}", flush=True)

    rows = []
    for policy in args.targets:
        clients_i = TARGETS[policy]
        reference, _, _ = replay(clients, initial, sets, excluded=set(clients_i))
        truth = [float(torch.norm(a - b)) for a, b in zip(models, reference)]
        bounds = {side: [max(b) for b in acc.bounds(clients_i)] for side, acc in ours.items()}
        theirs = metric[0][:, clients_i].max(axis=1)
        for epsilon, sigma in args.grid:
            budget, branch, index, loaded = their_rollback(copy, metric, clients_i, epsilon, sigma)
            common = {"seed": seed, "request": policy, "clients": len(clients_i),
                      "epsilon": epsilon, "delta": 1 / s["M"], "sigma": sigma,
                      "budget": budget, "rounds": rounds}  # fmt: skip
            their_round = index + 1
            row = {**common, "side": SIDES[0], "rollback_round": their_round,
                   "loaded_round": loaded + 1, "bound_at_rollback": float(theirs[index]),
                   "true_distance_at_rollback": truth[loaded]}  # fmt: skip
            if (epsilon, sigma) == tuple(args.check):
                row["fu_py_printed_round"] = int(printed[policy][-1][1]) + 1
                check[f"{policy}_fu_py_branch_agrees"] = row["fu_py_printed_round"] == their_round
            rows.append(row)
            for side, acc in ours.items():
                n = rollback_round(acc, clients_i, budget)
                rows.append({**common, "side": side, "rollback_round": n, "loaded_round": n,
                             "bound_at_rollback": bounds[side][n - 1],
                             "true_distance_at_rollback": truth[n - 1]})  # fmt: skip
            oracle = max(n for n, d in enumerate(truth, start=1) if d <= budget * (1 + 1e-12))
            rows.append({**common, "side": SIDES[3], "rollback_round": oracle,
                         "loaded_round": oracle, "bound_at_rollback": truth[oracle - 1],
                         "true_distance_at_rollback": truth[oracle - 1]})  # fmt: skip
        worst = max(t / b for t, b in zip(truth, theirs) if b > 0)
        check[f"{policy}_max_truth_over_their_psi"] = worst
        for side in ours:
            ratio = max(t / b for t, b in zip(truth, bounds[side]) if 0 < b < math.inf)
            check[f"{policy}_max_truth_over_{'default' if 'default' in side else 'nonexp'}"] = ratio
    for row in rows:
        row["holds"] = row["true_distance_at_rollback"] <= row["budget"] * (1 + 1e-9)
    return rows, check


def budgets(grid) -> pd.DataFrame:
    delta = 1 / SETTING["M"]
    rows = []
    for epsilon, sigma in grid:
        classical = sigma * epsilon / math.sqrt(2 * math.log(1.25 / delta))
        rows.append({
            "epsilon": epsilon, "delta": delta, "sigma": sigma,
            "budget_classical (theirs)": classical,
            "budget_analytic (our default)": unlearning_budget(
                epsilon, delta, sigma, mechanism="analytic"),
            "true_delta_of_classical": _analytic_delta(epsilon, classical / sigma),
        })  # fmt: skip
    return pd.DataFrame(rows)


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """One line per request and (epsilon, sigma): each side's rollback round over the seeds
    (their loaded model's round in brackets where it differs), and whether it held."""
    lines = []
    keys = ["request", "epsilon", "sigma"]
    for (request, epsilon, sigma), group in table.groupby(keys, sort=False):
        line = {"request": request, "epsilon": epsilon, "sigma": sigma,
                "budget": f"{group['budget'].iloc[0]:.4g}"}  # fmt: skip
        for side in SIDES:
            part = group[group["side"] == side].sort_values("seed")
            cells = []
            for _, row in part.iterrows():
                cell = str(int(row["rollback_round"]))
                if row["loaded_round"] != row["rollback_round"]:
                    cell += f" [{int(row['loaded_round'])}]"
                cells.append(cell + ("" if row["holds"] else "✗"))
            line[side] = " / ".join(cells)
        lines.append(line)
    return pd.DataFrame(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--reference-dir",
        type=Path,
        default=os.environ.get(REFERENCE_ENV),
        help=f"a checkout of their branch SIFU (default: ${REFERENCE_ENV})",
    )
    parser.add_argument("--data-root", default=default_data_root(), help="holds MNIST/raw")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=500, help="their --T (rounds trained)")
    parser.add_argument("--targets", nargs="+", choices=sorted(TARGETS), default=["P12", "P70"])
    parser.add_argument(
        "--check",
        type=float,
        nargs=2,
        default=[10.0, 0.01],
        metavar=("EPSILON", "SIGMA"),
        help="the pair their FU.py SIFU runs with (and trains with)",
    )
    parser.add_argument("--threads", type=int, default=1)
    common_args(parser, SIMULATIONS / "benchmarks" / "results", data_root=False)
    parser.add_argument("--log-dir", type=Path, default=Path("results/sifu-reference"))
    args = parser.parse_args(argv)  # fmt: skip
    if args.reference_dir is None or not (args.reference_dir / "FL" / "branch.py").is_file():
        parser.error(f"--reference-dir {args.reference_dir}: a checkout of their branch SIFU "
                     f"holding FL/branch.py (set it or ${REFERENCE_ENV})")  # fmt: skip
    if args.data_root is None or not (Path(args.data_root) / "MNIST" / "raw").is_dir():
        parser.error(f"--data-root {args.data_root}: a folder holding MNIST/raw")
    if SETTING["B"] < 100:
        raise SystemExit("the replay needs whole-client batches (B >= 100 samples per client)")
    args.grid = sorted(set(GRID) | {tuple(args.check)}, key=lambda p: (-p[0], p[1]))
    torch.set_num_threads(args.threads)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    rows, checks = [], []
    for seed in args.seeds:
        with tempfile.TemporaryDirectory(prefix="sifu-reference-") as scratch:
            copy = prepare_scratch(args.reference_dir, Path(args.data_root), Path(scratch))
            seed_rows, check = compare_seed(args, seed, copy, args.log_dir)
            if str(copy) in sys.path:  # the next seed imports its own copy's FL package
                sys.path.remove(str(copy))
            for name in [m for m in sys.modules if m == "FL" or m.startswith("FL.")]:
                del sys.modules[name]
        rows += seed_rows
        checks.append(check)
    table, checks = pd.DataFrame(rows), pd.DataFrame(checks)
    stem = args.output_dir / "sifu_reference"
    table.to_csv(stem.with_suffix(".csv"), index=False)
    checks.to_csv(args.output_dir / "sifu_reference_checks.csv", index=False)
    budget_table = budgets(args.grid)
    budget_table.to_csv(args.output_dir / "sifu_reference_budgets.csv", index=False)
    markdown = "\n\n".join([
        summary(table).to_markdown(index=False, disable_numparse=True),
        budget_table.to_markdown(index=False, floatfmt=".4g"),
        checks.to_markdown(index=False, floatfmt=".3g"),
    ])  # fmt: skip
    stem.with_suffix(".md").write_text(markdown + "\n")
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
