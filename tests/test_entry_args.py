"""``train.args`` checked against the entry's signature as parsed from its source (never
imported): pure, one case per kind of signature."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from hpctf.cli import cli
from hpctf.login.resolving.loader import args_problems
from tests.conftest import DIGITS

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


TYPED = ast.parse("""
from typing import Optional

def typed(lr: float = 0.1, units=32, name="x", flag: bool = False, depth: int | None = None,
          mode: "str" = "a", scale: Optional[float] = None, shape=None, *, width: int = 4):
    pass
""")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            {
                "lr": 1,
                "units": 8.5,
                "name": "y",
                "flag": True,
                "depth": None,
                "mode": "b",
                "scale": None,
                "shape": [1, 2],
                "width": 2,
            },
            [],
        ),
        ({"lr": "abc"}, ["lr: 'abc' is not a float: typed() takes lr as float (its annotation)"]),
        (
            {"units": "8"},
            ["units: '8' is not a number: typed() takes units as number (its default 32)"],
        ),
        (
            {"units": True},
            ["units: True is not a number: typed() takes units as number (its default 32)"],
        ),
        ({"name": 3}, ["name: 3 is not a str: typed() takes name as str (its default 'x')"]),
        ({"flag": 1}, ["flag: 1 is not a bool: typed() takes flag as bool (its annotation)"]),
        (
            {"depth": 2.5},
            ["depth: 2.5 is not an int: typed() takes depth as int or null (its annotation)"],
        ),
        ({"mode": 1}, ["mode: 1 is not a str: typed() takes mode as str (its annotation)"]),
        (
            {"scale": "x"},
            ["scale: 'x' is not a float: typed() takes scale as float or null (its annotation)"],
        ),
        (
            {"width": None},
            ["width: None is not an int: typed() takes width as int (its annotation)"],
        ),
    ],
)
def test_train_args_values_against_the_signatures_types(
    args: dict[str, Any], expected: list[str]
) -> None:
    train = SimpleNamespace(entry="seq:typed", args=args, loop="builtin")
    config: Any = SimpleNamespace(experiment=SimpleNamespace(train=train))
    found = [f"{path[-1]}: {message}" for path, message in args_problems(config, TYPED)]
    assert found == expected


def test_validate_and_sweep_refuse_a_value_of_the_wrong_type(runs_root: Path) -> None:
    validate = CliRunner().invoke(
        cli, ["validate", str(DIGITS), "--set", "train.args.learning_rate=abc"]
    )
    assert validate.exit_code == 2
    assert "train.args.learning_rate: 'abc' is not a float: build() takes learning_rate" in (
        validate.output
    )
    sweep = CliRunner().invoke(
        cli, ["sweep", str(DIGITS), "--grid", "train.args.learning_rate=0.1,abc", "--dry-run"]
    )
    assert sweep.exit_code == 2 and "'abc' is not a float" in sweep.output, sweep.output
    assert "0.1" not in sweep.output.split("'abc'")[0].rsplit("\n", 1)[-1]  # only abc named
    assert not runs_root.exists()
