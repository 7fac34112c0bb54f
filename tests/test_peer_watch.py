"""A SIGTERM to a rank whose peer died (srun --kill-on-bad-exit's answer to one rank's death)
ends the rank at once, exit 3, where it would wait to agree on a save that cannot come; with
every peer there, SIGTERM is a preemption and the watch does nothing. A process without
TensorFlow, blocked in a sleep as a rank in a collective would be."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from hpctf.compute.process import peer_watch

CHILD = """
import signal, sys, time
from hpctf.compute.process import peer_watch
signal.signal(signal.SIGTERM, lambda signum, frame: print("SIGTERM handled", flush=True))
print("armed" if peer_watch.arm() else "not armed", flush=True)
time.sleep(60)
"""


def free_port() -> int:
    """A port nothing listens on (bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_port_nothing_listens_on_refuses_and_a_server_does_not() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert not peer_watch.refuses(f"127.0.0.1:{server.getsockname()[1]}")
    assert peer_watch.refuses(f"127.0.0.1:{free_port()}")
    assert peer_watch.peers_of(
        json.dumps({"cluster": {"worker": ["a:1", "b:2", "c:3"]}, "task": {"index": 1}})
    ) == [(0, "a:1"), (2, "c:3")]


@pytest.mark.parametrize("peer_alive", [False, True], ids=["peer-dead", "peer-alive"])
def test_sigterm_with_a_dead_peer_ends_the_rank_at_once(peer_alive: bool) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        peer = server.getsockname()[1] if peer_alive else free_port()
        config = {
            "cluster": {"worker": [f"127.0.0.1:{free_port()}", f"127.0.0.1:{peer}"]},
            "task": {"type": "worker", "index": 0},
        }
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD],
            env={**os.environ, "TF_CONFIG": json.dumps(config)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None and child.stdout.readline() == "armed\n"
            sent = time.monotonic()
            child.send_signal(signal.SIGTERM)
            if peer_alive:
                with pytest.raises(subprocess.TimeoutExpired):
                    child.wait(timeout=3)  # a preemption: the agreed save's business
                return
            code = child.wait(timeout=30)
            elapsed = time.monotonic() - sent
        finally:
            if child.poll() is None:
                child.kill()
            out, err = child.communicate()
    assert code == 3, out + err
    assert elapsed < 5, f"{elapsed:.1f} s"  # the probe's confirmation takes 0.2 s
    assert f"Error: SIGTERM, and rank 1 (127.0.0.1:{peer}) is gone" in err, err
