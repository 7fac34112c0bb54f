"""The test suite's own rules: no test module imports another (shared helpers live in
conftest.py and the helper modules beside it: fake_slurm, journal_records, slurm_jobs,
entries)."""

from __future__ import annotations

import ast

from tests.conftest import REPO


def test_no_test_module_imports_another() -> None:
    found = []
    for path in sorted((REPO / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            found += [
                f"{path.name}:{node.lineno}: {name}"
                for name in names
                if name.startswith("tests.test_")
            ]
    assert not found, "move what is shared into tests/conftest.py or a helper:\n" + "\n".join(found)
