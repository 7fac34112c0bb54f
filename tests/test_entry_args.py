"""``train.args`` checked against the entry's signature as parsed from its source (never
imported): pure, one case per kind of signature."""

from __future__ import annotations

import ast
from types import SimpleNamespace
from typing import Any

import pytest

from hpctf.login.submitting.loader import args_problems

SOURCE = """
import functools

def build(units=32, lr=0.001):
    pass

def needs(units, *, lr, depth=2):
    pass

def anything(units=1, **rest):
    pass

def main(session, steps=10):
    pass

def positional(units, /, lr=0.1):
    pass

@functools.lru_cache
def decorated(units=1):
    pass

class Builder:
    def __init__(self, units=1):
        pass

twice = build
def twice(x=1):
    pass
"""
TREE = ast.parse(SOURCE)


def problems(entry: str, args: dict[str, Any], loop: str = "builtin") -> list[str]:
    train = SimpleNamespace(entry=f"seq:{entry}", args=args, loop=loop)
    config: Any = SimpleNamespace(experiment=SimpleNamespace(train=train))
    return [f"{'.'.join(path)}: {message}" for path, message in args_problems(config, TREE)]


@pytest.mark.parametrize(
    ("entry", "args", "loop", "expected"),
    [
        ("build", {"units": 8, "lr": 0.1}, "builtin", []),
        (
            "build",
            {"units": 8, "lrr": 0.1},
            "builtin",
            [
                "train.args.lrr: unknown argument of build() (did you mean 'lr'?); build() takes "
                "units, lr"
            ],
        ),
        (
            "needs",
            {"depth": 3},
            "builtin",
            ["train.args: needs() needs units, lr, not given; needs() takes units, lr, depth"],
        ),
        ("anything", {"whatever": 1}, "builtin", []),  # **kwargs takes any name
        ("main", {"steps": 5}, "custom", []),
        (
            "main",
            {"session": 1},
            "custom",
            ["train.args.session: unknown argument of main(); main() takes steps"],
        ),
        (
            "positional",
            {"units": 1},
            "builtin",
            ["train.args.units: unknown argument of positional(); positional() takes lr"],
        ),
        ("decorated", {"x": 1}, "builtin", []),  # a decorator may change the signature
        ("Builder", {"x": 1}, "builtin", []),  # not a def: not judged
        ("twice", {"y": 1}, "builtin", []),  # defined twice: not judged
    ],
)
def test_train_args_against_the_signature(
    entry: str, args: dict[str, Any], loop: str, expected: list[str]
) -> None:
    assert problems(entry, args, loop) == expected
