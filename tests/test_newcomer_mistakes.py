"""Twenty mistakes a newcomer makes on the first day, each refused before anything starts with one
line (exit 2, no traceback) that names what was wrong and says the fix; a misspelling is answered
with the right word."""

from __future__ import annotations

import pytest

from simulations import run as runner

#: (what the newcomer typed after ``fedunlearn-run``, what the one line must say), where ``{out}``
#: is a fresh output folder with a finished-looking run ``taken`` in it.
MISTAKES = [
    # misspelt keys
    (["--set", "local-epoch=3"], ["did you mean local-epochs?"]),
    (["--set", "unlearn_clients=3"], ["did you mean unlearn-clients?"]),
    (["--set", "Rounds=3"], ["did you mean rounds?"]),
    (["--set", "retain-intervall=2"], ["did you mean retain-interval?"]),
    # misspelt values
    (["--set", "unlearn-methods=fedraser,crab"], ["did you mean federaser?"]),
    (["--set", "partitioning=dirichet"], ["did you mean dirichlet?"]),
    (["--set", "dataset=mnsit"], ["did you mean mnist?"]),
    (["--set", "unlearn-adopt=federeaser"], ["did you mean federaser?"]),
    (["--set", "device=cdua"], ["did you mean cuda?"]),
    # wrong types and ranges
    (["--set", "rounds=five"], ["rounds", "a whole number", "e.g. 100"]),
    (["--set", "local-epochs=2.5"], ["local-epochs", "a whole number"]),
    (["--set", "scrub=yes"], ["scrub", "true or false"]),
    (["--set", "calibration-ratio=2"], ["calibration-ratio", "(0.0, 1.0]"]),
    (["--set", "unlearn-clients=10"], ["unlearn-clients", "[0, 9]"]),
    (["--set", "num-clients=1"], ["unlearn-clients=''", "raise num-clients"]),
    (["--set", "rounds", "5"], ["--set rounds=5"]),
    (["--num-cpus", "0"], ["--num-cpus", "a whole number >= 1"]),
    # missing paths
    (["simulations/digit.toml"], ["did you mean", "simulations/digits.toml?"]),
    (
        ["--set", "dataset=mnist", "--data-root", "{out}/no-data"],
        ["fedunlearn data download mnist --root", "--set download=true"],
    ),
    # reused and unknown run names
    (["--set", "run-name=taken"], ["choose another run-name", "resume=true"]),
    (
        ["--set", "run-name=never-ran", "--set", "unlearn-only=true", "--set", "unlearn-clients=1"],
        ["run-name", "a finished run under", "was never created"],
    ),
    (["--set", "run-name=a/b"], ["run-name", "without path separators"]),
]


@pytest.mark.parametrize(("argv", "says"), MISTAKES, ids=[" ".join(a) for a, _ in MISTAKES])
def test_a_newcomer_mistake_is_one_line_that_says_the_fix(
    argv, says, tmp_path, monkeypatch, capsys
):
    out = tmp_path / "out"
    (out / "taken").mkdir(parents=True)
    (out / "taken" / "metrics.csv").write_text("round\n0\n")
    monkeypatch.chdir(tmp_path)  # not the project: paths are the newcomer's own
    argv = [a.replace("{out}", str(out)) for a in argv]
    code = runner.main(["--dry-run", "--output-dir", str(out), *argv])
    printed = capsys.readouterr()
    assert code == 2, printed
    lines = printed.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedunlearn-run: error: "), printed.err
    for fragment in says:
        assert fragment in lines[0]
    assert printed.out == ""
    assert sorted(p.name for p in out.iterdir()) == ["taken"]  # nothing written


def test_the_table_holds_twenty_mistakes_or_more():
    assert len(MISTAKES) >= 20
