"""The README's test command is exactly what .ci/run runs (keep them from drifting apart)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _command_lines(text: str) -> list:
    return [line.strip() for line in text.splitlines() if ".venv/bin/python -m pytest" in line]


def test_ci_runs_the_readme_test_command():
    readme = _command_lines((ROOT / "README.md").read_text())
    ci = _command_lines((ROOT / ".ci" / "run").read_text())
    assert len(readme) == 1 and len(ci) == 1
    assert readme == ci


def test_readme_first_command_runs_the_bundled_example():
    text = (ROOT / "README.md").read_text()
    assert "vmr-handler run --local examples/demo.yaml" in text
    assert (ROOT / "examples" / "demo.yaml").exists()
