"""The search's contract between the wings: the experiment's ``sweep:`` schema (a bad
distribution is one line, exit 2), the study in a journal file (created once, shared by
several openers), and RUN/trial.json."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from hpctf.cli import cli
from hpctf.core.search.study import build_pruner, create_study, open_study
from hpctf.core.search.trial_ref import TRIAL_FILE, TrialRef, read_trial_ref, trial_ref_text
from hpctf.core.settings.search import Objective, Pruner, Search
from tests.conftest import DIGITS

GOOD = {
    "parameters": {
        "train.args.learning_rate": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True},
        "train.args.hidden": {"type": "int", "low": 8, "high": 64, "step": 8},
        "train.args.validation_fraction": {"type": "categorical", "choices": [0.1, 0.2]},
    },
    "objective": {"metric": "eval.loss", "direction": "minimize"},
    "trials": 24,
    "parallel": 4,
    "pruner": {"kind": "asha"},
}


def validate(tmp_path: Path, sweep: object) -> tuple[int, str]:
    experiment = yaml.safe_load(DIGITS.read_text())
    experiment["sweep"] = sweep
    experiment["train"]["python_path"] = [str(DIGITS.parent)]
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(experiment))
    result = CliRunner().invoke(cli, ["validate", str(path), "--site", "local"])
    return result.exit_code, result.output


def test_a_search_validates(tmp_path: Path) -> None:
    code, output = validate(tmp_path, GOOD)
    assert code == 0, output


def test_submit_of_a_search_says_it_starts_one_run_and_validate_does_not(tmp_path: Path) -> None:
    code, output = validate(tmp_path, GOOD)
    assert code == 0 and "warning" not in output, output
    path = tmp_path / "experiment.yaml"
    result = CliRunner().invoke(cli, ["submit", "--dry-run", str(path), "--site", "local"])
    assert result.exit_code == 0, result.output
    assert (
        f"warning: {path} has a sweep: section, which submit does not read: this starts one "
        f"run with the experiment's own values; `hpctf sweep {path}` runs the search"
    ) in result.stderr


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"parameters": {"train.args.lr": {"type": "float", "low": 1, "high": 0}}}, "below high"),
        ({"parameters": {"train.args.lr": {"type": "beta", "low": 0, "high": 1}}}, "'float'"),
        ({"parameters": {"train.args.lr": {"type": "float", "low": 0, "high": 1, "log": True}}},
         "low > 0"),
        ({"parameters": {"lr": {"type": "float", "low": 0, "high": 1}}}, "train.args.lr"),
        ({"parameters": {"train.args.a": {"type": "categorical", "choices": [1, 1]}}}, "twice"),
        ({"parameters": {"train.args.a": {"type": "categorical", "choices": [1, True]}}},
         "choices 1 and True are equal to Optuna"),
        ({"parameters": {"train.args.a": {"type": "categorical", "choices": [0.0, 0]}}},
         "equal to Optuna"),
        ({"objective": {"metric": "loss", "direction": "minimize"}},
         "'loss' is no evaluation metric: give eval.NAME"),
        ({"objective": {"metric": "eval.", "direction": "minimize"}}, "no evaluation metric"),
        ({"parameters": {}}, "at least 1"),
        ({"objective": {"metric": "eval.loss", "direction": "up"}}, "'minimize' or 'maximize'"),
        ({"trials": 0}, "greater than or equal to 1"),
        ({"pruner": {"kind": "hyperband"}}, "max_evals"),
        ({"sampler": "grid"}, "step"),
        ({"sampler": "annealing"}, "'tpe', 'random' or 'grid'"),
    ],
)  # fmt: skip
def test_a_bad_search_is_one_line_naming_the_key_and_exit_2(
    tmp_path: Path, change: dict[str, object], said: str
) -> None:
    code, output = validate(tmp_path, {**GOOD, **change})
    assert code == 2, output
    assert output.count("\n") == 1 and "Traceback" not in output, output
    assert "sweep" in output and said in output, output


def test_a_study_is_created_once_and_shared_by_its_openers(tmp_path: Path) -> None:
    """Two processes' worth of openers see one study: trials asked through one are in the
    other; a second create (a retried submit) loads it instead of starting over."""
    search = Search.model_validate(GOOD)
    journal = tmp_path / "study.journal"
    first = create_study(journal, "s", search)
    trial = first.ask()
    trial.report(0.5, 1)
    again = create_study(journal, "s", search)
    other = open_study(journal, "s", search.pruner)
    assert [t.number for t in again.trials] == [0]
    assert other.trials[0].intermediate_values == {1: 0.5}
    assert other.direction.name == "MINIMIZE"


@pytest.mark.parametrize(
    ("spec", "name"),
    [
        (Pruner(kind="asha"), "SuccessiveHalvingPruner"),
        (Pruner(kind="hyperband", max_evals=9), "HyperbandPruner"),
        (Pruner(), "NopPruner"),
    ],
)
def test_each_pruner_kind_is_optunas(spec: Pruner, name: str) -> None:
    assert type(build_pruner(spec)).__name__ == name


def test_a_trial_ref_round_trips_and_a_run_without_one_is_no_trial(tmp_path: Path) -> None:
    assert read_trial_ref(tmp_path) is None
    ref = TrialRef(
        journal=str(tmp_path / "study.journal"),
        study="s",
        number=3,
        trial_id=3,
        params={"train.args.learning_rate": 0.01, "train.args.activation": "relu"},
        objective=Objective(metric="eval.loss", direction="minimize"),
        pruner=Pruner(kind="asha", min_evals=2),
    )
    (tmp_path / TRIAL_FILE).write_text(trial_ref_text(ref))
    assert read_trial_ref(tmp_path) == ref


@pytest.mark.parametrize("choice", ["@home", "`x", "[a", "%x", "|x", "\x1b"])
def test_categorical_choices_yaml_cannot_parse_back_are_one_line(
    choice: str, tmp_path: Path
) -> None:
    """Each choice is checked as ``--set KEY=TEXT`` gives it; a text YAML cannot parse made
    validate exit 70 (a bug line): now the entry's annotation judges it, one line, exit 2."""
    experiment = yaml.safe_load(DIGITS.read_text())
    experiment["train"]["python_path"] = [str(DIGITS.parent)]
    experiment["train"]["eval_every_steps"] = 50
    experiment["sweep"] = {
        "parameters": {"train.args.learning_rate": {"type": "categorical", "choices": [choice]}},
        "objective": {"metric": "eval.loss", "direction": "minimize"},
        "trials": 2,
    }
    path = tmp_path / "search.yaml"
    path.write_text(yaml.safe_dump(experiment))
    result = CliRunner().invoke(cli, ["validate", str(path), "--site", "local-slurm"])
    assert result.exit_code == 2, result.output
    (line,) = result.output.splitlines()
    assert "is not a float" in line and "bug" not in line


def test_a_trials_parameters_reach_the_terminal_escaped_and_cut() -> None:
    """status SWEEP: a newline and an OSC sequence in a choice painted a fake row; a 50 KB
    value made a 50 KB line."""
    from hpctf.login.sweeps.search_watch import PARAMS_CHARS, _params_text

    painted = _params_text({"train.args.act": "relu\n3  {}  done\x1b]0;owned\x07"})
    assert "\n" not in painted and "\x1b" not in painted and "\x07" not in painted
    assert painted.startswith("act=relu\\n3")
    long = _params_text({"train.args.act": "x" * 50_000, "train.args.lr": 0.1})
    assert len(long) == PARAMS_CHARS and long.endswith("...")


@pytest.mark.parametrize("line", ['{"op_code": 4, "worker_id": "w"}', "[1, 2]", '"text"', "7"])
def test_a_journal_line_of_valid_json_in_the_wrong_shape_is_a_damaged_record(
    line: str, tmp_path: Path
) -> None:
    """Valid JSON Optuna's replay cannot take exited 70 with Optuna's bare KeyError."""
    from hpctf.core.errors import EnvironmentProblem
    from hpctf.core.search.study import JOURNAL_FILE

    search = Search.model_validate(
        {
            "parameters": {"train.args.lr": {"type": "float", "low": 0.001, "high": 0.1}},
            "objective": {"metric": "eval.loss", "direction": "minimize"},
            "trials": 4,
        }
    )
    journal = tmp_path / JOURNAL_FILE
    create_study(journal, "search", search)
    with journal.open("a") as handle:
        handle.write(line + "\n")
    with pytest.raises(EnvironmentProblem, match=r"cannot replay|damaged|cut short"):
        open_study(journal, "search", search.pruner)
