"""No module of the project is over 500 lines: a module past that is two ideas that want to be two files."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 500


def test_no_module_of_any_package_is_over_500_lines() -> None:
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["root_packages"]
    sizes = {path.relative_to(ROOT).as_posix(): len(path.read_text().splitlines())
             for package in packages for path in (ROOT / package).rglob("*.py")}
    assert len(sizes) > 100, f"the packages were not found under {ROOT}: {sorted(packages)}"
    assert {path: n for path, n in sizes.items() if n > MAX_LINES} == {}
