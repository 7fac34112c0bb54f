"""``sweep:`` in an experiment: a search instead of a grid (the schema only).

A search names its parameters as distributions (a float or log-float range, an int range, a
list of choices), the objective (an evaluation metric and whether to minimize or maximize
it), how many trials in all and how many at once, the sampler (TPE, random, or the grid of
every choice) and a pruner that stops trials early (successive halving, Hyperband, or none).
Optuna runs the study (:mod:`hpctf.core.search.study`); this module imports nothing of it, so
``hpctf validate`` checks a search on a login node without Optuna.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from hpctf.core.settings.values import Strict

# A key path of the experiment a parameter sets, as --set takes it: train.args.lr.
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)+$")
MAX_TRIALS = 100_000


def _key_path(key: str) -> str:
    if not _KEY.fullmatch(key):
        raise ValueError(
            f"{key!r} is no key path of the experiment; give the dotted path a --set would "
            "take, e.g. train.args.lr"
        )
    return key


KeyPath = Annotated[str, AfterValidator(_key_path)]
Choice = str | int | float | bool


class FloatParam(Strict):
    """A float drawn from [low, high]; ``log``: uniform in log space (low > 0); ``step``: a
    grid of low, low+step, ... (the grid sampler needs it)."""

    type: Literal["float"] = Field(description="float: a real number from [low, high]")
    low: float = Field(description="the smallest value")
    high: float = Field(description="the largest value")
    log: bool = Field(False, description="uniform in log space (low > 0): rates, decays")
    step: float | None = Field(None, gt=0, description="only low, low+step, ...: a grid")

    @model_validator(mode="after")
    def _bounds(self) -> FloatParam:
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            raise ValueError("low and high must be finite numbers")
        if not self.low < self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        if self.log and self.low <= 0:
            raise ValueError(f"a log range needs low > 0 (got {self.low})")
        if self.log and self.step is not None:
            raise ValueError("give log or step, not both")
        return self


class IntParam(Strict):
    """An int drawn from [low, high] (both included), every ``step``-th; ``log``: uniform in
    log space (low >= 1)."""

    type: Literal["int"] = Field(description="int: an integer from [low, high], both included")
    low: int = Field(description="the smallest value")
    high: int = Field(description="the largest value")
    log: bool = Field(False, description="uniform in log space (low >= 1): widths, batch sizes")
    step: int = Field(1, ge=1, description="only low, low+step, ...")

    @model_validator(mode="after")
    def _bounds(self) -> IntParam:
        if not self.low < self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        if self.log and self.low < 1:
            raise ValueError(f"a log range needs low >= 1 (got {self.low})")
        if self.log and self.step != 1:
            raise ValueError("give log or step, not both")
        return self


class CategoricalParam(Strict):
    """One of ``choices`` (strings, numbers or booleans, each once)."""

    type: Literal["categorical"] = Field(description="categorical: one of a list")
    choices: list[Choice] = Field(
        min_length=1, max_length=10_000, description="strings, numbers or booleans, each once"
    )

    @model_validator(mode="after")
    def _distinct(self) -> CategoricalParam:
        seen: list[Choice] = []
        for choice in self.choices:
            # 1, 1.0 and true are one choice to Optuna, which finds a choice by == (its
            # CategoricalDistribution.to_internal_repr): a trial drawn true would run with 1.
            for other in seen:
                if choice == other and type(choice) is type(other):
                    raise ValueError(f"choice {choice!r} given twice; each choice once")
                if choice == other:
                    raise ValueError(
                        f"choices {other!r} and {choice!r} are equal to Optuna (it compares "
                        "with ==): give one of them, or quote them as strings"
                    )
            seen.append(choice)
        return self


Param = Annotated[FloatParam | IntParam | CategoricalParam, Field(discriminator="type")]


class Objective(Strict):
    """The value a trial is judged by: the last evaluation's ``metric`` (``eval.loss``,
    ``eval.accuracy``: a key of the run's eval records). Only an evaluation's: the pruner
    judges the evaluations, and a trial must be judged on what it was pruned by."""

    metric: str = Field(
        max_length=200, description="the evaluation's key, e.g. eval.loss or eval.accuracy"
    )
    direction: Literal["minimize", "maximize"] = Field(description="which way is better")

    @field_validator("metric")
    @classmethod
    def _an_evaluation(cls, metric: str) -> str:
        if not re.fullmatch(r"eval\.[A-Za-z_][A-Za-z0-9_./-]*", metric):
            raise ValueError(
                f"{metric!r} is no evaluation metric: give eval.NAME, e.g. eval.loss or "
                "eval.accuracy (the evaluations' values, as metrics.jsonl records them)"
            )
        return metric


class Pruner(Strict):
    """Early stopping, fed by every evaluation of a trial (an evaluation is one unit of
    resource). ``asha``: asynchronous successive halving (Optuna's SuccessiveHalvingPruner);
    ``hyperband``: Optuna's HyperbandPruner, its largest bracket ``max_evals`` evaluations;
    ``none``: every trial runs to its end."""

    kind: Literal["asha", "hyperband", "none"] = Field(
        "none", description="asha (successive halving), hyperband, or none"
    )
    min_evals: int = Field(1, ge=1, le=1_000_000, description="evaluations before any pruning")
    reduction_factor: int = Field(
        3, ge=2, le=100, description="each rung keeps the best 1/reduction_factor of trials"
    )
    max_evals: int | None = Field(
        None, ge=1, le=1_000_000, description="hyperband: evaluations of a whole trial"
    )

    @model_validator(mode="after")
    def _hyperband(self) -> Pruner:
        if self.kind == "hyperband" and self.max_evals is None:
            raise ValueError("hyperband needs max_evals: how many evaluations a whole trial has")
        if self.max_evals is not None and self.max_evals < self.min_evals:
            raise ValueError(f"max_evals ({self.max_evals}) is below min_evals ({self.min_evals})")
        return self


class Search(Strict):
    """A search: ``trials`` runs, at most ``parallel`` at once, each asking the study for its
    parameters."""

    sampler: Literal["tpe", "random", "grid"] = Field(
        "tpe", description="tpe (Bayesian), random, or grid (every choice, each once)"
    )
    parameters: dict[KeyPath, Param] = Field(
        min_length=1, description="experiment key path (train.args.lr) -> distribution"
    )
    objective: Objective
    trials: int = Field(
        ge=1, le=MAX_TRIALS, description="trials asked in all, failed ones included"
    )
    parallel: int = Field(1, ge=1, le=10_000, description="trials at once: the array's size")
    pruner: Pruner = Field(default_factory=Pruner)
    seed: int = Field(0, ge=0, le=2**32 - 1, description="the sampler's seed")

    @model_validator(mode="after")
    def _grid(self) -> Search:
        if self.sampler != "grid":
            return self
        for key, param in self.parameters.items():
            if isinstance(param, FloatParam) and param.step is None:
                raise ValueError(f"{key}: the grid sampler needs a float's step (or choices)")
            if isinstance(param, (FloatParam, IntParam)) and param.log:
                raise ValueError(f"{key}: the grid sampler takes no log range; give choices")
        return self
