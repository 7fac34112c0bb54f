"""A sweep from Python: :class:`Sweep` reads one (its points, ``status SWEEP --json``'s
documents, the best point by a metric); :func:`hpctf.python_api.submit_api.sweep` starts one
as ``hpctf sweep`` does."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctf.core.errors import UserError
from hpctf.login.calls.models import Mode, PointRef, Request, Result, SweepRequest, SweepView
from hpctf.python_api.run_api import BACKOFF, MAX_POLL, Run


@dataclass(frozen=True)
class Point:
    """One point of a sweep: its index, the values it set (typed as the experiment took them:
    int, float, bool, str, list), and its run."""

    index: int
    values: dict[str, Any]
    run: Run


class Sweep:
    """A sweep directory (``hpctf sweep`` printed it). Every method is one typed call
    (:class:`hpctf.login.calls.models.SweepRequest`): here, or on the login host for a sweep
    there (:class:`hpctf.python_api.remote_run.RemoteSweep`)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).resolve()
        self._view(documents=False)  # a UserError now, when it is not a sweep directory

    def __repr__(self) -> str:
        return f"hpctf.Sweep({str(self.path)!r})"

    def _answer(self, request: Request) -> Result:
        from hpctf.login.calls.table import answer

        return answer(request)

    def _run(self, path: str) -> Run:
        return Run(path)

    def _view(
        self,
        metric: str | None = None,
        mode: Mode | None = None,
        documents: bool = True,
        watching: bool = False,
    ) -> SweepView:
        request = SweepRequest(
            sweep_dir=str(self.path),
            metric=metric,
            mode=mode,
            documents=documents,
            watching=watching,
        )
        answered = self._answer(request)
        assert isinstance(answered, SweepView)
        return answered

    def _point(self, point: PointRef) -> Point:
        return Point(point.index, dict(point.values), self._run(point.run_dir))

    @property
    def is_search(self) -> bool:
        """A search (its points are the trials the study asked for), not a grid."""
        return self._view(documents=False).search

    @property
    def points(self) -> list[Point]:
        return [self._point(point) for point in self._view(documents=False).points]

    def status(self) -> list[dict[str, Any]]:
        """One document per point, as ``hpctf status SWEEP --json`` prints them: index,
        values, run_dir, job, slurm, state, why, step, loss, eval (last), best_eval (a
        search's: one per trial, with trial, params, value too)."""
        return self._view().documents

    def wait(self, timeout: float | None = None, poll: float = 10.0) -> dict[int, str]:
        """Block until every point has ended (as :meth:`Run.wait` says); each point's state.
        A search: until its whole budget is asked and every trial is done, pruned or failed.
        The pause between looks grows from ``poll`` as :meth:`Run.wait`'s does."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = poll
        while True:
            view = self._view(watching=True)
            if view.over:
                return {int(d["index"]): str(d["state"]) for d in view.documents}
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"{self.path}: points still running after {timeout} s")
            left = pause if deadline is None else deadline - time.monotonic()
            time.sleep(max(0.0, min(pause, left)))
            pause = min(MAX_POLL, max(pause, poll) * BACKOFF)

    def best(self, metric: str | None = None, mode: str | None = None) -> Point | None:
        """The point with the best ``metric`` (``eval.NAME``: its last evaluation;
        ``best_eval.NAME``; ``loss``; default ``eval.accuracy``), highest unless
        ``mode="min"`` or ``NAME:min`` (default: lowest for names with loss, error, mae, mse
        and the like), as ``hpctf status SWEEP --sort METRIC`` ranks them. None when no point
        has logged it.

        A search without ``metric``: its best trial as ``hpctf status SWEEP`` shows it (the
        study's best COMPLETE trial by the search's objective), its index the trial's number
        and its values the trial's parameters."""
        modes: dict[str | None, Mode | None] = {None: None, "min": "min", "max": "max"}
        if mode not in modes:
            raise UserError(f"mode={mode!r}: give 'min' or 'max' (or leave it out)")
        best = self._view(metric, modes[mode]).best
        return None if best is None else self._point(best)
