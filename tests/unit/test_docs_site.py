"""The docs site's structure and its generated references: every page in the nav and every nav entry a page,
every setting and every command in the references (so a new one cannot be left undocumented)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer
import yaml
from pydantic import BaseModel

from streamtrain.cli import app
from streamtrain.cli.reference import cli_reference, config_reference, escape_markdown
from streamtrain.config import StreamtrainConfig

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


class _Loader(yaml.SafeLoader):
    """mkdocs.yml may hold `!!python/name:` tags (Material's extensions); the nav is all this test reads."""


_Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)


def _nav_pages(nav: Any) -> Iterator[str]:
    if isinstance(nav, str):
        yield nav
    elif isinstance(nav, list):
        for item in nav:
            yield from _nav_pages(item)
    elif isinstance(nav, dict):
        for value in nav.values():
            yield from _nav_pages(value)


def _nav() -> list[str]:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_Loader)
    return list(_nav_pages(config["nav"]))


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page() -> None:
    nav = _nav()
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if "hooks" not in p.parts)
    twice = sorted({p for p in nav if nav.count(p) > 1})
    assert twice == [], "pages listed twice in the nav"
    assert [p for p in pages if p not in nav] == [], "pages missing from the nav of mkdocs.yml"
    assert [p for p in nav if p not in pages] == [], "nav entries of mkdocs.yml without a page under docs/"


def test_the_site_layout_has_the_pages_newcomers_are_pointed_to() -> None:
    nav = set(_nav())
    for page in ("index.md", "quickstart.md", "guides/data.md", "guides/producing.md", "guides/models.md",
                 "guides/configuration.md", "guides/cli.md", "operations/compose.md", "operations/security.md",
                 "operations/faults.md", "architecture.md", "development/testing.md", "benchmarks.md"):
        assert page in nav


def _settings(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from _settings(annotation, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}"


def test_the_configuration_reference_lists_every_setting_with_its_docstring() -> None:
    text = config_reference()
    missing = [s for s in _settings(StreamtrainConfig) if f"| `{s}` |" not in text]
    assert missing == []
    row = next(line for line in text.splitlines() if line.startswith("| `kafka.partitions` |"))
    assert row.split(" | ")[1:3] == ["int", "`1`"]
    assert "Partitions per topic when streamtrain creates it" in row
    assert "## kafka\n" in text and "### producer.rate\n" in text
    assert "`trainer.plan_wait_s` is now `trainer.plan_wait_seconds`" in text  # renamed settings listed


def test_the_configuration_reference_has_no_undocumented_setting() -> None:
    undocumented = [line.split(" | ")[0] for line in config_reference().splitlines()
                    if line.startswith("| `") and line.rstrip().endswith("|  |")]
    assert undocumented == [], "settings without a docstring"


def _commands(command: Any, path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    yield path
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def test_the_cli_reference_has_every_command_and_option() -> None:
    text = cli_reference()
    root = typer.main.get_command(app)
    paths = list(_commands(root, ("streamtrain",)))[1:]
    assert len(paths) > 20
    assert [p for p in paths if f"## {' '.join(p)}\n" not in text] == []
    up = text.split("## streamtrain up\n", 1)[1].split("\n## ", 1)[0]
    assert "`--dataset NAME/PATH`" in up and "`--duration <float range>`" in up
    assert "[default: 4; 1&lt;=x&lt;=64]".replace("[", "\\[").replace("]", "\\]") in up
    assert "--install-completion" not in text


def test_markdown_escaping_keeps_code_and_neutralises_markup() -> None:
    assert escape_markdown("topic <prefix>.device.<id>, `a|b` *x*") == (
        "topic &lt;prefix&gt;.device.&lt;id&gt;, `a\\|b` \\*x\\*")
    assert re.fullmatch(r"[^\n]*", escape_markdown("two\nlines"))


def test_each_benchmark_has_its_method_page_and_the_results_page_links_it_once() -> None:
    import importlib.util

    from streamtrain.benchmarks.registry import REGISTRY

    spec = importlib.util.spec_from_file_location("docs_hook", DOCS / "hooks" / "reference.py")
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page, nav = hook.benchmarks_page(), _nav()
    for bench in REGISTRY:
        method = (DOCS / "benchmarks" / f"{bench.name}.md").read_text()
        assert bench.about == method and f"benchmarks/{bench.name}.md" in nav
        # The results page names the method page (a link the site resolves) instead of repeating its text.
        assert f"How it measures: [{bench.name}](benchmarks/{bench.name}.md)." in page
        assert method.strip().splitlines()[-1] not in page
