"""The public surface: what users' code imports is `streamtrain` and its documented first-level modules, nothing
deeper; every exported name resolves; the examples and the guides keep to it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import streamtrain

ROOT = Path(__file__).resolve().parents[2]
#: The first-level modules whose exports are public (docs/reference/api.md says so, with the stability promise).
PUBLIC_MODULES = {"streamtrain", "streamtrain.config", "streamtrain.wire", "streamtrain.kafka", "streamtrain.models",
                  "streamtrain.objectives", "streamtrain.datasets", "streamtrain.versions", "streamtrain.decoders",
                  "streamtrain.publish"}


def _imports(source: str) -> set[str]:
    found: set[str] = set()
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a fragment (`...` in a signature): its import lines say the same
        found = set(re.findall(r"^\s*(?:from|import) ([\w.]+)", source, re.M))
        return {m for m in found if m == "streamtrain" or m.startswith("streamtrain.")}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m == "streamtrain" or m.startswith("streamtrain.")}


def _python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), re.S)


def test_every_exported_name_resolves_and_all_is_the_lazy_table() -> None:
    assert set(streamtrain.__all__) == set(streamtrain._LAZY)
    for name in streamtrain.__all__:
        assert getattr(streamtrain, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'internals'"):
        _ = streamtrain.internals


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.py")), ids=lambda p: p.name)
def test_the_examples_import_only_the_public_surface(path: Path) -> None:
    assert _imports(path.read_text()) <= PUBLIC_MODULES


@pytest.mark.parametrize("page", [ROOT / "README.md", *sorted((ROOT / "docs" / "guides").glob("*.md"))],
                         ids=lambda p: p.name)
def test_the_guides_import_only_the_public_surface(page: Path) -> None:
    used = set().union(*(_imports(block) for block in _python_blocks(page)))
    assert used <= PUBLIC_MODULES, sorted(used - PUBLIC_MODULES)


def test_the_api_reference_documents_every_export() -> None:
    page = (ROOT / "docs" / "reference" / "api.md").read_text()
    assert set(re.findall(r"^::: streamtrain\.(\w+)$", page, re.M)) == set(streamtrain.__all__)
    for module in sorted(PUBLIC_MODULES - {"streamtrain"}):
        assert f"`{module}`" in page, module
