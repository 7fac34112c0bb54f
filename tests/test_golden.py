"""Golden rendered scripts: every shipped site x every example, byte for byte.

A change to a rendered script is a change to what users submit: it must be made on purpose.
Regenerate after such a change, and review the diff like code:

    HPCTF_REGENERATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_golden.py

Machine-specific parts are fixed or normalised: HOME is /home/user, the interpreter
/usr/bin/python3, the run directory <runs_root>/<name>-20250101-000000, the version VERSION,
and the repository path <repo> in --explain notes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctf import __version__
from hpctf.login.resolving.loader import load_config
from hpctf.login.submitting import scaffold
from hpctf.login.submitting.render import explain, render
from tests.conftest import REPO
from tests.goldens import check_golden

GOLDEN = Path(__file__).resolve().parent / "golden"
SITES = sorted(p.stem for p in (REPO / "site_configs").glob("*.yaml"))
ENV = {"HOME": "/home/user"}


def examples(tmp: Path) -> dict[str, Path]:
    """The shipped examples, what `hpctf init` writes, and an experiment giving every key."""
    scaffold.write(tmp / "init", "local", "init", False, ENV)
    found = {p.parent.name: p for p in sorted((REPO / "examples").glob("*/experiment.yaml"))}
    return {**found, "init": tmp / "init" / "experiment.yaml", "full": GOLDEN / "full.yaml"}


EXAMPLES = sorted(
    [p.parent.name for p in (REPO / "examples").glob("*/experiment.yaml")] + ["init", "full"]
)


def rendered(site: str, experiment: Path, with_notes: bool = False) -> str:
    loaded = load_config(experiment, site, (), ENV, python="/usr/bin/python3")
    config = loaded.config
    run_dir = Path(config.site.runs_root) / f"{config.experiment.name}-20250101-000000"
    script = render(config, run_dir)
    if with_notes:
        script = explain(script, config, loaded.origins)
    script = script.replace(f"hpctf '{__version__}'", "hpctf 'VERSION'")
    return script.replace(str(experiment.parent), "<experiment>").replace(str(REPO), "<repo>")


def check(name: str, text: str) -> None:
    check_golden(GOLDEN, name, text)


def test_examples_are_all_covered(tmp_path: Path) -> None:
    """Spelled out, not globbed: a new site or example must get goldens on purpose."""
    assert sorted(examples(tmp_path)) == [
        "custom_loop",
        "digits",
        "full",
        "init",
        "keras_fit",
        "tfrecords",
    ]
    assert SITES == ["ib-8gpu", "ib-apptainer", "ib-pyxis", "ib-suffix", "local", "local-slurm"]


@pytest.mark.parametrize("example", EXAMPLES)
@pytest.mark.parametrize("site", SITES)
def test_golden_script(tmp_path: Path, site: str, example: str) -> None:
    check(f"{site}--{example}.sbatch", rendered(site, examples(tmp_path)[example]))


@pytest.mark.parametrize(("site", "example"), [("ib-suffix", "full"), ("local-slurm", "digits")])
def test_golden_explain(tmp_path: Path, site: str, example: str) -> None:
    check(f"{site}--{example}.explain", rendered(site, examples(tmp_path)[example], True))


def test_golden_files_are_all_in_use(tmp_path: Path) -> None:
    expected = {f"{s}--{e}.sbatch" for s in SITES for e in EXAMPLES}
    expected |= {"ib-suffix--full.explain", "local-slurm--digits.explain", "full.yaml"}
    assert {p.name for p in GOLDEN.iterdir()} == expected
