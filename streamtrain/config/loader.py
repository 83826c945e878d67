"""Load the one configuration from a TOML file, then environment variables, then CLI flags.

Precedence, lowest first: defaults < TOML file < ``STREAMTRAIN_<SECTION>__<FIELD>`` environment
variables < flags. A bad value raises `ConfigError` naming the setting, where it came from, and
what is allowed; the CLI turns that into exit status 2 before any service starts. A renamed setting
still loads under its old name for one release, with a warning naming the new one (`renames`).
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, SecretStr, ValidationError

from .core import StreamtrainConfig
from .renames import RenamedSettingError, upgrade_dotted, upgrade_tree

__all__ = ["ENV_PREFIX", "ConfigError", "config_environment", "load_config", "parse_assignment"]

ENV_PREFIX = "STREAMTRAIN_"
CONFIG_FILE_ENV = "STREAMTRAIN_CONFIG"


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names every bad setting."""


def parse_assignment(text: str) -> tuple[str, Any]:
    """Parse a ``--set section.field=value`` flag; the value is JSON when it parses as JSON."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE, e.g. kafka.partitions=2")
    return key.strip(), _maybe_json(raw)


def load_config(
    path: Path | str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> StreamtrainConfig:
    """Build the validated configuration.

    Args:
        path: TOML file; default ``$STREAMTRAIN_CONFIG`` when set, else none.
        env: environment to read (default `os.environ`).
        overrides: dotted keys → values from flags, highest precedence; None values are ignored.

    Raises:
        ConfigError: naming each bad setting, its source and what is allowed.
    """
    env = os.environ if env is None else env
    sources: dict[str, str] = {}
    merged: dict[str, Any] = {}
    path = path or env.get(CONFIG_FILE_ENV) or None
    try:
        if path is not None:
            file_data = upgrade_tree(_read_toml(Path(path)), StreamtrainConfig, f"file {path}")
            _record_sources(file_data, (), f"file {path}", sources)
            _deep_merge(merged, file_data)
        env_settings = ((f"environment {name}", dotted, _maybe_json(raw))
                        for name, raw in sorted(env.items()) if (dotted := _env_key(name)) is not None)
        flag_settings = (("command line", dotted, value) for dotted, value in (overrides or {}).items()
                         if value is not None)
        # Environment variables have no order, so one setting under two names is an error; on the command line
        # the later one wins, as it does for one name (a command's own flag over --set).
        _set_all(merged, env_settings, sources, one_name=True)
        _set_all(merged, flag_settings, sources, one_name=False)
    except RenamedSettingError as exc:
        raise ConfigError(str(exc)) from None
    try:
        return StreamtrainConfig.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, sources)) from None


def _set_all(merged: dict[str, Any], settings: Iterable[tuple[str, str, Any]], sources: dict[str, str], *,
             one_name: bool) -> None:
    """Set one kind of source's dotted settings, (source, key, value) each, under their current names.

    Raises:
        RenamedSettingError: with `one_name`, a setting is given under its old and its new name.
    """
    given: dict[str, str] = {}
    for source, dotted, value in settings:
        current, value = upgrade_dotted(dotted, value, StreamtrainConfig, source)
        if one_name and current in given and (current != dotted or given[current] != current):
            raise RenamedSettingError(f"{current} is given twice, by {sources[current]} and by {source} (one "
                                      f"under its old name): keep only {current}")
        given[current] = dotted
        _set_dotted(merged, current, value)
        sources[current] = source


def config_environment(config: BaseModel) -> dict[str, str]:
    """The resolved configuration as environment variables (`STREAMTRAIN_<SECTION>` = JSON) for child processes.

    Secrets are written in clear: a child must authenticate exactly as its parent does, and the
    environment of one's own children is the one place they may go (never logs, metrics or status).
    """
    env: dict[str, str] = {}
    for name, value in _revealed(config).items():
        env[f"{ENV_PREFIX}{name.upper()}"] = json.dumps(value) if isinstance(value, dict) else str(value)
    return env


def _revealed(model: BaseModel) -> dict[str, Any]:
    """`model_dump(mode="json")` with every SecretStr replaced by its value (pydantic masks them)."""
    data = model.model_dump(mode="json")

    def reveal(value: Any, dumped: Any) -> Any:
        if isinstance(value, SecretStr):
            return value.get_secret_value()
        if isinstance(value, BaseModel):
            return {k: reveal(getattr(value, k), dumped[k]) for k in dumped}
        if isinstance(value, dict) and isinstance(dumped, dict):
            return {k: reveal(value[k], dumped[k]) if k in value else dumped[k] for k in dumped}
        return dumped

    return {k: reveal(getattr(model, k), data[k]) for k in data}


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None


def _env_key(name: str) -> str | None:
    """`STREAMTRAIN_KAFKA__BOOTSTRAP_SERVERS` → `kafka.bootstrap_servers`; None for other variables."""
    if not name.startswith(ENV_PREFIX) or name == CONFIG_FILE_ENV:
        return None
    parts = name[len(ENV_PREFIX):].lower().split("__")
    if parts[0] in StreamtrainConfig.model_fields or len(parts) > 1:
        return ".".join(parts)
    return None  # e.g. STREAMTRAIN_TEST_BOOTSTRAP: not a setting


def _maybe_json(raw: str) -> Any:
    text = raw.strip()
    if text[:1] in "{[":
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return raw
    return raw


def _set_dotted(target: dict[str, Any], dotted: str, value: Any) -> None:
    *heads, last = dotted.split(".")
    node = target
    for head in heads:
        child = node.setdefault(head, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{dotted}: {head} is a value, not a section")
        node = child
    node[last] = value


def _deep_merge(target: dict[str, Any], extra: Mapping[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(target.get(key), dict):
            _deep_merge(target[key], value)
        else:
            target[key] = value


def _record_sources(data: Mapping[str, Any], prefix: tuple[str, ...], source: str, out: dict[str, str]) -> None:
    for key, value in data.items():
        out[".".join((*prefix, key))] = source
        if isinstance(value, Mapping):
            _record_sources(value, (*prefix, key), source, out)


def _describe(exc: ValidationError, sources: Mapping[str, str]) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        source = _source_of(err["loc"], sources)
        what = err["msg"]
        if err["type"] == "extra_forbidden":
            what = f"unknown setting (known here: {', '.join(_known_keys(err['loc'][:-1]))})"
        got = "" if err["type"] in ("extra_forbidden", "missing") else _shown(loc, err["input"])
        lines.append(f"  {loc}: {what}{got} [from {source}]")
    return "invalid configuration:\n" + "\n".join(lines)


def _source_of(loc: tuple[Any, ...], sources: Mapping[str, str]) -> str:
    """Where the setting at `loc` came from: its own key's source; for a section (a rule across its settings), the
    settings in it that were given and where; else that of the nearest section or list above it (a list of
    tables, e.g. bridge.sources, is given whole)."""
    key = ".".join(str(p) for p in loc)
    if key not in sources:
        given = sorted(k for k in sources if k.startswith(key + ".") and k.count(".") == key.count(".") + 1)
        if given:
            return "; ".join(f"{sources[k]}: {k}" for k in given[:4]) + ("; ..." if len(given) > 4 else "") + \
                "; the others default"
    for end in range(len(loc), 0, -1):
        found = sources.get(".".join(str(p) for p in loc[:end]))
        if found is not None:
            return found
    return "default"


def _shown(loc: str, value: Any) -> str:
    """A bad value as an error message may show it: secrets masked, whole sections left out."""
    if isinstance(value, Mapping):
        return ""
    if "password" in loc or "secret" in loc or "scram_users" in loc:
        return " (got '***')"
    return f" (got {value!r})"


def _known_keys(loc: tuple[Any, ...]) -> list[str]:
    """The settings a section at `loc` has, through lists and tables of sections (`bridge.sources.0.mapping`)."""
    node: Any = StreamtrainConfig
    for part in loc:
        node = _inner(node, part)
    model = _model_of(node)
    return sorted(model.model_fields) if model is not None else []


def _inner(annotation: Any, part: Any) -> Any:
    """The type of `part` (a field's name, an item's index or a table's key) inside a value of type `annotation`."""
    model = _model_of(annotation)
    if model is not None:
        field = model.model_fields.get(str(part))
        return field.annotation if field is not None else None
    origin, args = get_origin(annotation), [a for a in get_args(annotation) if a is not Ellipsis]
    if origin in (tuple, list, Sequence) and isinstance(part, int) and args:
        return args[part] if origin is tuple and len(args) > 1 and part < len(args) else args[-1]
    if origin in (dict, Mapping) and len(args) == 2:
        return args[1]
    return None


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The section type `annotation` is, or allows besides None (`X | None`); None when it is no section."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, UnionType):
        models = [m for a in get_args(annotation) if (m := _model_of(a)) is not None]
        return models[0] if len(models) == 1 else None
    return None
