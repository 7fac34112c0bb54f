"""A trial's run directory knows its study: ``RUN/trial.json`` (pure data, no Optuna).

Written once when the trial's run directory is made (by the array task that asked the study
for the trial), read by the run's workers (the chief reports each evaluation and asks whether
to prune) and by anything that shows the run. A run without the file is no trial.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pydantic's models: not imported for `hpctf status SWEEP` of a grid
    from hpctf.core.settings.search import Objective, Pruner

TRIAL_FILE = "trial.json"


@dataclass(frozen=True)
class TrialRef:
    """Where a trial's study lives and which trial this run is."""

    journal: str  # absolute path of the study's journal file (in the sweep directory)
    study: str  # the study's name
    number: int  # the trial's number in the study (0, 1, ...)
    trial_id: int  # Optuna's id of the trial in that storage
    params: dict[str, Any]  # experiment key path -> value
    objective: Objective
    pruner: Pruner

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["objective"] = self.objective.model_dump()
        data["pruner"] = self.pruner.model_dump()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrialRef:
        from hpctf.core.settings.search import Objective, Pruner

        return cls(
            journal=str(data["journal"]),
            study=str(data["study"]),
            number=int(data["number"]),
            trial_id=int(data["trial_id"]),
            params=dict(data["params"]),
            objective=Objective.model_validate(data["objective"]),
            pruner=Pruner.model_validate(data["pruner"]),
        )


def read_trial_ref(run_dir: Path) -> TrialRef | None:
    """The run's trial, or None for a run that is no trial. A damaged file raises
    ``ValueError`` (or ``KeyError``/``TypeError``) for the caller to name."""
    try:
        text = (run_dir / TRIAL_FILE).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    return TrialRef.from_json(json.loads(text))


def trial_ref_text(ref: TrialRef) -> str:
    """The file's text (the writer puts it in place atomically)."""
    return json.dumps(ref.to_json(), indent=2, sort_keys=True) + "\n"
