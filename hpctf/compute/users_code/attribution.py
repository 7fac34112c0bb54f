"""The fourth cause: an exception raised in the user's code is the user's, not hpctf's.

hpctf calls user code at a few boundaries (the entry, the data functions, ``Files.read``, the
loss and metrics while TensorFlow traces the step, callbacks, a script). These wrappers turn what
escapes from there into a :class:`UserCodeError` that says where, in one line::

    your code raised TypeError at seq.py:12 in build: build() got an unexpected keyword ...

- :func:`call` calls one user function; a ``TypeError`` raised by the call itself (the
  arguments do not fit the signature) names the function and its signature.
- :class:`region` wraps a stretch of hpctf code that runs user code inside it (the training
  loop, a script run with ``runpy``).
- :func:`model_call`, :func:`loss_call`, :func:`metric_call`: how the traced step calls the
  model, loss and metrics, so that a Keras loss or layer that raises (labels of the wrong
  shape) is the user's too, named at Keras's line, though no frame of theirs is below.

Whose it is, is read from the traceback (:func:`blame`): walking from the raising frame
outwards, library frames (the standard library, site-packages: TensorFlow, Keras) are skipped,
and the first frame left decides: hpctf's own package -> hpctf's bug (re-raised as it is, the CLI
says so, exit 70); anything else -> the user's. Code that TensorFlow traces inside a
``tf.function`` (a loss, a metric) runs as AutoGraph's generated copy and the frames that point
at the user's file are only in the message (``in user code: File "...", line N, in name``);
those are read from there.

:func:`report` is what the worker does with one: the user's traceback without hpctf's frames
around it, the line, a ``user_code_failed`` journal record, exit status
:data:`hpctf.core.errors.USER_CODE_EXIT`. The record reads::

    {"event": "user_code_failed", "time": ..., "job_id": "41", "node": "node017", "rank": 3,
     "error": "TypeError", "at": "seq.py:12", "line": "your code raised TypeError at ..."}
"""

from __future__ import annotations

import inspect
import logging
import re
import site
import sys
import sysconfig
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TypeVar

from hpctf.core.errors import USER_CODE_EXIT, EnvironmentProblem, UserError, one_line
from hpctf.core.run import journal
from hpctf.core.secrets import redact

log = logging.getLogger("hpctf.worker")

T = TypeVar("T")

_HPCTF = str(Path(__file__).resolve().parents[1]) + "/"
# AutoGraph's traced copy of a function: "in user code:" then the frames of the original source.
_TRACED = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>\S+)', re.M)
_GENERATED = "__autograph_generated_file"
_THIS = Path(__file__).name


class UserCodeError(Exception):
    """An exception raised in the user's code. ``line`` is the one line that says what and
    where; the original exception is the ``__cause__``."""

    exit_code = USER_CODE_EXIT

    def __init__(self, line: str, error: str, at: str) -> None:
        line = one_line(line)  # the whole message is in the traceback above it
        super().__init__(line)
        self.line = line
        self.error = error
        self.at = at


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    name: str


@cache
def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    roots.update(site.getsitepackages())
    roots.add(site.getusersitepackages())
    return tuple(str(Path(r).resolve()) + "/" for r in roots)


def whose(file: str) -> str:
    """``hpctf``, ``library`` (standard library, installed packages, generated code) or
    ``user`` for a frame's file name."""
    if file.startswith("<") or _GENERATED in file:
        return "library"
    try:
        path = str(Path(file).resolve())
    except OSError:
        path = file
    if path.startswith(_HPCTF):
        return "hpctf"
    if path.startswith(_library_roots()):
        return "library"
    return "user"


def _traced_message(error: BaseException) -> str:
    """AutoGraph's ``in user code:`` text: the message once the error left the ``tf.function``,
    or the metadata AutoGraph attached while it passes through converted code."""
    text = str(error)
    if text.startswith("in user code:"):
        return text
    metadata = getattr(error, "ag_error_metadata", None)
    try:
        return str(metadata.get_message()) if metadata is not None else ""
    except Exception:  # AutoGraph's internals: without them, the traceback alone
        return ""


def _frames(error: BaseException, skip: int = 0) -> list[Frame]:
    """The frames of ``error`` (the ``skip`` outermost left out), outermost first; for code
    traced by AutoGraph, the frames its message names after those of the traceback (they are
    deeper: the traced code)."""
    frames = [
        Frame(f.f_code.co_filename, line or 0, f.f_code.co_name)
        for f, line in traceback.walk_tb(error.__traceback__)
    ][skip:]
    traced = _traced_message(error)
    frames += [Frame(m["file"], int(m["line"]), m["name"]) for m in _TRACED.finditer(traced)]
    return frames


# hpctf's calls into what the user gave it, inside the traced step: a frame of one of these
# with only library frames below (a Keras loss, a Keras layer) means the user's choice raised.
BOUNDARIES = {"model_call": "Task model", "loss_call": "Task loss", "metric_call": "Task metric"}


def model_call(model: Any, features: Any, training: bool) -> Any:
    return model(features, training=training)


def loss_call(loss: Callable[[Any, Any], Any], y_true: Any, y_pred: Any) -> Any:
    return loss(y_true, y_pred)


def metric_call(metric: Callable[[Any, Any], Any], y_true: Any, y_pred: Any) -> Any:
    return metric(y_true, y_pred)


@dataclass(frozen=True)
class Blame:
    """Whose frame raised: ``user``, ``hpctf`` or ``library`` (only library frames), the
    frame to name, and what of the user's hpctf called when a library raised (else None)."""

    kind: str
    frame: Frame
    what: str | None = None


def blame(error: BaseException, skip: int = 0) -> Blame | None:
    """Walking out from the raising frame past library frames to the first of hpctf's or the
    user's (``skip``: outer frames to leave out). A frame of :data:`BOUNDARIES` with library
    frames below: the user's, named at the raising frame. None without frames."""
    if isinstance(error, SyntaxError) and error.filename and whose(error.filename) == "user":
        return Blame("user", Frame(error.filename, error.lineno or 0, "<module>"))  # compiler
    frames = _frames(error, skip)
    for index in range(len(frames) - 1, -1, -1):
        frame = frames[index]
        kind = whose(frame.file)
        if kind == "user":
            return Blame("user", frame)
        if kind == "hpctf":
            boundary = frame.name in BOUNDARIES and Path(frame.file).name == _THIS
            if boundary and index < len(frames) - 1:
                return Blame("user", frames[-1], BOUNDARIES[frame.name])
            return Blame("hpctf", frame)
    return Blame("library", frames[-1]) if frames else None


def culprit(error: BaseException) -> Blame | None:
    """Who in the user's code raised ``error``, or None when hpctf's own frame did."""
    found = blame(error)
    return found if found is not None and found.kind == "user" else None


def _message(error: BaseException) -> str:
    """The exception's own words, without AutoGraph's list of frames."""
    text = str(error)
    if text.startswith("in user code:"):
        last = text.strip().splitlines()[-1].strip()
        prefix = f"{type(error).__name__}: "
        text = last.removeprefix(prefix)
    return " ".join(text.split()) or "(no message)"


def short_path(file: str) -> str:
    """``file`` relative to the longest ``sys.path`` entry holding it (as the user's import
    names it), else its name."""
    path = Path(file)
    best: Path | None = None
    for entry in sys.path:
        try:
            relative = path.relative_to(Path(entry or ".").resolve())
        except (ValueError, OSError):
            continue
        if best is None or len(relative.parts) < len(best.parts):
            best = relative
    return str(best) if best is not None else path.name


def attribute(error: BaseException, found: Blame) -> UserCodeError:
    frame = found.frame
    at = f"{short_path(frame.file)}:{frame.line}"
    name = type(error).__name__
    who = f"your {found.what}" if found.what else "your code"
    line = f"{who} raised {name} at {at} in {frame.name}: {_message(error)}"
    return UserCodeError(line, name, at)


def signature_of(function: Callable[..., Any]) -> str:
    """``name(parameters)`` as the user wrote it, for a line about a call that did not fit."""
    name = getattr(function, "__qualname__", None) or type(function).__name__
    try:
        return f"{name}{inspect.signature(function)}"
    except (TypeError, ValueError):
        return f"{name}(...)"


def _definition(function: Callable[..., Any]) -> Frame | None:
    code = getattr(inspect.unwrap(function), "__code__", None)
    if code is None:
        return None
    return Frame(code.co_filename, code.co_firstlineno, code.co_name)


def call(what: str, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``function(*args, **kwargs)``, something of the user's that hpctf calls as ``what``
    (``train.entry seq:build``, ``train_data``, ``Task loss``): what it raises becomes a
    :class:`UserCodeError` unless hpctf's own frame raised it. Raised inside a library the user
    gave (a Keras loss, layer or callback, nothing of theirs or hpctf's below): theirs, at the
    library's line. A ``TypeError`` from the call itself (arguments that do not fit) names
    ``what`` and the signature. Inside a ``tf.function`` it acts while the code is traced."""
    try:
        return function(*args, **kwargs)
    except (UserError, EnvironmentProblem, UserCodeError):
        raise
    except Exception as exc:
        tb = exc.__traceback__
        name = type(exc).__name__
        if tb is not None and tb.tb_next is None and not _traced_message(exc):
            if not isinstance(exc, TypeError):
                raise  # raised by this frame itself: hpctf's
            defined = _definition(function)
            at = f"{short_path(defined.file)}:{defined.line}" if defined else what
            line = (
                f"your code raised {name} at {at} in {what}: {_message(exc)}; "
                f"it takes {signature_of(function)}"
            )
            raise UserCodeError(line, name, at) from exc
        found = blame(exc, skip=1)  # below this frame
        if found is None or found.kind == "hpctf":
            raise
        if found.kind == "library":  # only the library's frames: what the user gave raised
            found = Blame("user", found.frame, what)
        raise attribute(exc, found) from exc


class region:
    """``with region():`` around hpctf code that runs user code (the training loop, a script):
    an exception the user's frame raised leaves as a :class:`UserCodeError`; hpctf's own,
    :class:`UserError` (back to one line when raised in a traced step),
    :class:`EnvironmentProblem` and ``SystemExit`` leave unchanged."""

    def __enter__(self) -> region:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        if error is None or not isinstance(error, Exception):
            return False
        if isinstance(error, UserError) and str(error).startswith("in user code:"):
            # hpctf's own check inside a traced step: AutoGraph put its frames in the message.
            raise UserError(_message(error)) from None
        if isinstance(error, (UserError, EnvironmentProblem, UserCodeError)):
            return False
        found = culprit(error)
        if found is None:
            return False
        raise attribute(error, found) from error


def _trimmed(error: BaseException) -> traceback.TracebackException:
    """``error``'s traceback from the first user frame on (hpctf's and TensorFlow's calls
    around the user's code left out); AutoGraph's errors keep their own list of frames."""
    te = traceback.TracebackException.from_exception(error)
    _trim(te)
    return te


def _trim(te: traceback.TracebackException) -> None:
    frames = list(te.stack)
    first = next((i for i, f in enumerate(frames) if whose(f.filename) == "user"), None)
    if first is not None:
        te.stack = traceback.StackSummary.from_list(frames[first:])
    for chained in (te.__cause__, te.__context__):
        if chained is not None:
            _trim(chained)


def traceback_text(error: UserCodeError) -> str:
    """The user's traceback as the rank log shows it."""
    original = error.__cause__ if error.__cause__ is not None else error
    return "".join(_trimmed(original).format())


def report(error: UserCodeError, run: Any, spec: Any) -> int:
    """Log ``error`` (traceback, then its line), record it in ``run``'s journal; return the
    exit status. ``run`` is a RunDir, ``spec`` the task's ClusterSpec. Every rank that raised
    records (like a failed node check): the others may be ended by srun before they can."""
    sys.stdout.write(redact(traceback_text(error)))  # the rank log may be read by others
    sys.stdout.flush()
    log.error("%s", error.line)
    try:
        journal.record_user_code_failed(
            run, spec.journal_job, spec.node, spec.task_index, error.error, error.at, error.line
        )
    except EnvironmentProblem as exc:  # the journal's disk may be full: the log still says it
        log.error("could not record it in the journal: %s", exc)
    return USER_CODE_EXIT
