"""A SIGTERM that comes because a peer died: leave at once, not at KillWait's SIGKILL.

srun ``--kill-on-bad-exit`` answers one rank's death with SIGTERM to every other rank, and
SIGKILL KillWait later (30 s by default, 5 s on the test cluster). A rank takes SIGTERM for a
preemption and waits to agree on a save with every rank: with one of them dead that never
comes, and its main thread sits in a collective (aborted by TensorFlow's heartbeat check some
10 s later), where no Python signal handler runs. Measured on the test cluster: the survivor
was SIGKILLed 5.1 s after the kill, and srun (so the batch script, so the next start) waited
for it.

While training runs (between :func:`arm` and :func:`disarm`), a thread reads the signal
numbers that Python's C-level handler writes to its wakeup fd whatever the main thread does.
At the first SIGTERM it asks every peer's TensorFlow server (TF_CONFIG's addresses) whether it
is there: the port of a process that died refuses a TCP connection at once. A refusal, seen
twice, ends this rank with the environment's exit 3 and one line naming the peer. A peer that
answers, or does not answer in time (a lost node, a frozen rank), changes nothing: the agreed
save, the heartbeat check and the watchdog go on as before. Once training ended (the peers
may leave first: :func:`hpctf.compute.process.leaving.ending`), nothing is probed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time

from hpctf.compute.process.leaving import ending, exit_now
from hpctf.core.errors import ENVIRONMENT_EXIT

PROBE_TIMEOUT_S = 1.0  # a live server on a loaded node accepts well within it
CONFIRM_AFTER_S = 0.2  # the second probe of a refusing peer

_state: dict[str, object] = {}


def peers_of(tf_config: str) -> list[tuple[int, str]]:
    """The other workers of TF_CONFIG JSON ``tf_config`` as (rank, "host:port")."""
    config = json.loads(tf_config)
    workers = config.get("cluster", {}).get("worker", [])
    me = config.get("task", {}).get("index")
    return [(rank, address) for rank, address in enumerate(workers) if rank != me]


def refuses(address: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether ``address`` ("host:port") refuses a TCP connection: nothing listens there."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return False
    except ConnectionRefusedError:
        return True
    except (OSError, ValueError):  # a timeout, an unreachable host: not known to be gone
        return False


def gone_peers(peers: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The peers whose servers refuse a connection, twice (:data:`CONFIRM_AFTER_S` apart)."""
    first = [peer for peer in peers if refuses(peer[1])]
    if not first:
        return []
    time.sleep(CONFIRM_AFTER_S)
    return [peer for peer in first if refuses(peer[1])]


def arm() -> bool:
    """Start watching for SIGTERM (main thread; TF_CONFIG set, every server up: after the
    strategy exists, with Python handlers for SIGTERM installed). False where there is
    nothing to watch (one worker, no TF_CONFIG) or a watch is already armed."""
    text = os.environ.get("TF_CONFIG")
    if "reader" in _state or not text:
        return False
    try:
        peers = peers_of(text)
    except (ValueError, AttributeError):
        return False
    if not peers:
        return False
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    try:
        previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    except ValueError:  # not the main thread
        reader.close()
        writer.close()
        return False
    _state.update(reader=reader, writer=writer, previous=previous)
    threading.Thread(
        target=_watch, args=(reader, peers), name="hpctf-peer-watch", daemon=True
    ).start()
    return True


def disarm() -> None:
    """Stop watching (main thread): the wakeup fd as it was, the thread ends."""
    if "reader" not in _state:
        return
    previous = _state.pop("previous")
    signal.set_wakeup_fd(previous if isinstance(previous, int) else -1)
    for key in ("writer", "reader"):
        end = _state.pop(key)
        if isinstance(end, socket.socket):
            end.close()


def _watch(reader: socket.socket, peers: list[tuple[int, str]]) -> None:
    while True:
        try:
            got = reader.recv(64)
        except OSError:
            return
        if not got:
            return  # disarmed
        if signal.SIGTERM in got and not ending():
            gone = gone_peers(peers)
            if gone and not ending():
                _leave(gone)
            return  # one look: a later SIGTERM is the agreed save's business


def _leave(gone: list[tuple[int, str]]) -> None:
    who = ", ".join(f"rank {rank} ({address})" for rank, address in gone)
    message = (
        f"Error: SIGTERM, and {who} is gone (its port refuses connections): a peer died, so "
        "there is no agreed save to make; this rank leaves at once (the run resumes from its "
        "last checkpoint). The cause is in that rank's log and in what Slurm says of the job"
    )
    print(message, file=sys.stderr, flush=True)
    exit_now(ENVIRONMENT_EXIT)
