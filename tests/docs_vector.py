"""The worked test vector of docs/guides/wire-format.md, read from the page itself (so the page cannot drift):
the unit tests check that streamtrain writes exactly it, the integration tests send it with kcat and train it."""

from __future__ import annotations

import re
from pathlib import Path

DOCS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "wire-format.md"


def docs_block(marker: str) -> str:
    """The ```text block right after the comment `<!-- marker -->` on the page."""
    found = re.search(rf"<!-- {re.escape(marker)} -->\n```text\n(.*?)```", DOCS_PAGE.read_text(), re.S)
    assert found, f"no {marker!r} block in {DOCS_PAGE}"
    return found.group(1)


def docs_test_vector() -> tuple[bytes, list[tuple[str, bytes]]]:
    """The test vector's value (its one-line hex) and headers (`st-size: 3`, as the page says)."""
    return bytes.fromhex(docs_block("test-vector: value").strip()), [("st-size", b"3")]
