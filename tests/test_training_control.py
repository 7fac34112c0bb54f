"""The step protocol has one implementation (hpctf/compute/loop/control.py): no other module
of the package builds a checkpointer or restores one, votes on a preemption or a prune,
records a save for a requeue, or names the signals the ranks watch. Read from the package's
source (no TensorFlow)."""

from __future__ import annotations

import ast
import signal
from pathlib import Path

from tests.conftest import REPO

PACKAGE = REPO / "hpctf"
CONTROL = "hpctf/compute/loop/control.py"

# A call of this name (function or method) -> the only modules that may make it.
PROTOCOL_CALLS = {
    "Checkpointer": {CONTROL},  # the agreed save and restore
    "checkpoint_of": {CONTROL},
    "restore_agreed": {CONTROL},
    "save_outlasts_warning": {CONTROL},  # the slow-save warning
    "agree": {CONTROL, "hpctf/compute/loop/preemption.py"},  # the preemption vote (its flags)
    "record_saved_for_restart": {CONTROL},
    # The vote's requeue record; a plain script's own exit 75 (no hpctf callbacks) too.
    "record_saved_on_warning": {CONTROL, "hpctf/compute/script/entry.py"},
    "record_pruned": {"hpctf/compute/loop/pruning.py"},  # the trial's record, made by control
    "trial_pruning": {CONTROL},
    "peer_lost": {CONTROL, "hpctf/compute/loop/training.py", "hpctf/compute/script/entry.py"},
}
WATCHED = {signal.SIGUSR2.name, signal.SIGTERM.name}


def _modules() -> list[tuple[str, ast.Module]]:
    return [
        (str(path.relative_to(REPO)), ast.parse(path.read_text(), str(path)))
        for path in sorted(PACKAGE.rglob("*.py"))
    ]


def _called(node: ast.Call) -> str | None:
    if isinstance(node.func, ast.Name):
        return node.func.id
    if isinstance(node.func, ast.Attribute):
        return node.func.attr
    return None


def test_the_step_protocol_is_called_from_the_control_only() -> None:
    strays = [
        f"{name}: {name_}() at line {node.lineno}"
        for name, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (name_ := _called(node)) in PROTOCOL_CALLS
        and name not in PROTOCOL_CALLS[name_]
    ]
    assert not strays, "a second implementation of the step protocol:\n" + "\n".join(strays)


def test_the_watched_signals_are_named_once() -> None:
    """A tuple holding both SIGUSR2 and SIGTERM is the set of watched signals: one, in
    agreement.py, which the preemption watch and the step flags both import."""
    found = []
    for name, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Tuple, ast.Set, ast.List)):
                names = {e.attr for e in node.elts if isinstance(e, ast.Attribute)}
                if names >= WATCHED:
                    found.append(f"{name}:{node.lineno}")
    assert found and all(f.startswith("hpctf/compute/loop/agreement.py:") for f in found), found
    assert len(found) == 1, found


def test_every_adapter_goes_through_the_control() -> None:
    """The built-in loop, the Session and fit's callback each use TrainingControl and define
    none of its methods' work themselves."""
    for adapter in ("hpctf/compute/loop/session.py", "hpctf/compute/script/fit.py"):
        text = Path(REPO / adapter).read_text()
        assert "TrainingControl" in text, adapter
        for own in ("def _agree", "def _check_preemption", "def _leave_for_requeue", "def _save("):
            assert own not in text, f"{adapter}: {own}"
