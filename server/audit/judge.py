"""The judge run: N independent federations trained as one stack, one client forgotten by every
unlearning method in each, and every population judged per example (:mod:`fedunlearn.judge`).

With ``judge-models = N`` the ordinary pipeline runs on a :class:`ModelStack` of N networks: each
message carries the N models (``members.<i>.<tensor>``) and each client trains them at once, so the
retention schedule, FedEraser's calibration, FedRetrain's participants and the reply checks are the
single run's, model by model (eq. 2's norms are per tensor, hence per member). Member i is the run a
single federation with ``model-seed`` = the i-th stack seed would train: the same partitions, its own
initial weights and batch order. Populations:

* ``original`` — the N trained models (the floor of forgetting);
* every method of ``unlearn-methods`` — its N unlearned models, ``fedretrain`` being the reference R;
* ``retrain-independent`` — N more retrained models from other seeds (the ceiling: R against R).

Then the target's retained updates are deleted, as after any unlearning request. The forget set
(the target's samples), a retained client's samples and the test set are read by the server for
measurement only, as the unlearning readouts do in a simulation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from flwr.serverapp import Grid

from fedunlearn.config import ExperimentConfig
from fedunlearn.data.federated_data import FederatedData
from fedunlearn.judge import INDEPENDENT, ORIGINAL, JudgeData, Outputs
from fedunlearn.judge.report import judge_table, separated, write_judge_report
from fedunlearn.progress import Progress
from fedunlearn.registry import UNLEARNING, retention_policies
from fedunlearn.seeding import derive_seed
from fedunlearn.store.history import forget_clients
from fedunlearn.training.local import resolve_device
from fedunlearn.training.model_state import State
from server.method_runner import MethodRunner, diverged_methods
from server.progress import Log, count
from server.training.original import train_federated
from server.training.rounds import (
    TrainingOutcome,
    fedavg_rounds,
    initial_model,
    participant_strategy,
    stack_seeds,
)
from server.unlearning.going_on import keep_training_last
from server.unlearning.request import UnlearningContext


@dataclass(frozen=True)
class JudgeSets:
    """The examples every model is read on (inputs, labels), and the triggered test inputs."""

    forget: tuple[torch.Tensor, torch.Tensor]
    retained: tuple[torch.Tensor, torch.Tensor]
    remaining: tuple[torch.Tensor, torch.Tensor]
    test: tuple[torch.Tensor, torch.Tensor]
    triggered: torch.Tensor | None
    backdoor_class: int


def drop_diverged(runner: MethodRunner, log: Log) -> dict[str, str]:
    """The methods whose rounds diverged (``details["diverged"]``, e.g. a post-training whose every
    reply was refused as not finite), taken out of the judge with why: the population of a model a
    diverged method left behind is no verdict on the method."""
    diverged = diverged_methods(runner.details)
    for method, why in diverged.items():
        runner.models.pop(method, None)
        runner.seconds.pop(method, None)
        log(f"judge: FLAGGED {method}: diverged ({why}); it is not judged")
    return diverged


def run_judge(grid: Grid, config: ExperimentConfig, *, log: Log = print) -> JudgeData:
    """Train, unlearn and retrain N federations as stacks; write ``judge.csv/.md/.png``."""
    started = time.perf_counter()
    outcome = train_federated(grid, config, log=log)
    training_seconds = time.perf_counter() - started
    target = config.unlearn_targets[0]
    remaining = outcome.members.nodes(exclude=[target])
    log(
        f"judge: forgetting client {target} in {config.judge_models} federations with "
        f"{', '.join(config.methods)}"
    )
    context = UnlearningContext(
        grid, outcome, [target], remaining, log, candidates=[], targets=[target]
    )
    runner = MethodRunner(outcome.run, log=log, label="judge ")
    runner.add(ORIGINAL, outcome.final_state)
    runner.seconds[ORIGINAL] = training_seconds
    context.costs = runner.costs  # keep-training spends another method's client-epochs
    specs = keep_training_last([UNLEARNING[name] for name in config.methods])
    # the procedures of the N federations: every method, then the independent retraining
    procedures = Progress("judge", len(specs) + 1, unit="procedures", log=log).start()
    runner.run_all(specs, context, progress=procedures)
    diverged = drop_diverged(runner, log)
    runner.time(
        INDEPENDENT,
        lambda: independent_retrain(grid, outcome, remaining, log=log),
        model_file=f"model_{INDEPENDENT}",
    )
    procedures.advance()
    deleted = forget_clients(outcome.store, [target], retention_policies())
    log(f"judge: deleted {deleted} retained update(s) of client {target}; reading every model")
    data = judge_data(outcome, runner.models, runner.seconds, judge_sets(outcome, target))
    rng = np.random.default_rng(derive_seed(config.seed, "judge-bootstrap"))
    table = judge_table(
        data, config.judge_metric_names, rng=rng, progress=lambda line: log(f"judge: {line}")
    )
    log("judge: writing judge.csv, judge.md, judge_rmia.csv and judge.png")
    write_judge_report(data, table, outcome.run.path)
    seconds = time.perf_counter() - started
    outcome.run.write_json(
        "judge.json",
        {
            "models": config.judge_models,
            "seconds": seconds,
            "separated": separated(table),
            "diverged": diverged,
        },
    )
    log(f"judge: {config.judge_models} models per population in {seconds:.1f}s")
    log("judge:\n" + (outcome.run.path / "judge.md").read_text())
    return data


def independent_retrain(
    grid: Grid, outcome: TrainingOutcome, remaining_nodes: list[int], *, log: Log
) -> State:
    """FedRetrain from N other seeds: a second retrained population, independent of the first."""
    config = outcome.config
    seeds = stack_seeds(config, INDEPENDENT)
    model = initial_model(config, outcome.data.splits, seeds)

    def progress(server_round, _result, _metrics, replied, round_seconds):
        log(
            f"{INDEPENDENT}: round {server_round}/{config.rounds}, {count(replied, 'client')}, "
            f"{round_seconds:.1f}s"
        )

    return fedavg_rounds(
        grid,
        participant_strategy(
            config, remaining_nodes, members=outcome.members, phase=INDEPENDENT, log=log
        ),
        model,
        config,
        on_round=progress,
        extra_config={"stack-seeds": seeds},
        screen=outcome.screen,
        phase=INDEPENDENT,
        log=log,
    )


def judge_sets(outcome: TrainingOutcome, target: int) -> JudgeSets:
    """The forget set (the target's samples as it trained on them), the first remaining client's
    samples, all remaining clients' samples, the test set and the triggered test inputs."""
    data: FederatedData = outcome.data
    others = [p for p in range(data.num_clients) if p != target]
    forget = data.client_split(target)
    retained = data.client_split(others[0])
    rest = [data.client_split(p) for p in others]
    test = data.splits.test
    plan = data.backdoor
    triggered = None if plan is None else plan.triggered_test(test.x, test.y)
    return JudgeSets(
        forget=(forget.x, forget.y),
        retained=(retained.x, retained.y),
        remaining=(torch.cat([s.x for s in rest]), torch.cat([s.y for s in rest])),
        test=(test.x, test.y),
        triggered=triggered,
        backdoor_class=-1 if plan is None else plan.target_class,
    )


def judge_data(
    outcome: TrainingOutcome, models: dict[str, State], seconds: dict[str, float], sets: JudgeSets
) -> JudgeData:
    """Every population's N models read on the judge's sets."""
    populations = {
        name: population_outputs(outcome, state, seconds.get(name, float("nan")), sets)
        for name, state in models.items()
    }
    return JudgeData(populations, target=f"client {outcome.config.unlearn_targets[0]}")


def population_outputs(
    outcome: TrainingOutcome, state: State, seconds: float, sets: JudgeSets
) -> Outputs:
    """One population's logits on the forget, retained and test sets; per-model accuracies and
    backdoor success; its time shared over its N models."""
    device = resolve_device(outcome.config.device)  # CUDA when the server has it
    stack = outcome.new_model()
    stack.load_state_dict(state)

    def logits(x: torch.Tensor) -> np.ndarray:
        return stack.logits(x, device=device).double().numpy()

    test_logits = logits(sets.test[0])
    n = stack.num_members
    backdoor = None
    if sets.triggered is not None:
        predicted = logits(sets.triggered).argmax(axis=2)
        backdoor = (predicted == sets.backdoor_class).mean(axis=1)
    return Outputs(
        forget_logits=logits(sets.forget[0]),
        forget_labels=sets.forget[1].numpy(),
        retained_logits=logits(sets.retained[0]),
        retained_labels=sets.retained[1].numpy(),
        population_logits=test_logits,
        population_labels=sets.test[1].numpy(),
        test_accuracy=_accuracy(test_logits, sets.test[1]),
        retain_accuracy=_accuracy(logits(sets.remaining[0]), sets.remaining[1]),
        seconds=np.full(n, seconds / n),
        backdoor_success=backdoor,
    )


def _accuracy(logits: np.ndarray, labels: torch.Tensor) -> np.ndarray:
    """Each model's accuracy: ``logits`` (N, n, C) against ``labels`` (n,)."""
    return (logits.argmax(axis=2) == labels.numpy()[None, :]).mean(axis=1)
