"""The model directory: versions written atomically, found by number, read back with their checks, the last K kept.

Layout of `versions.dir`:

    v000001/model.json           what the model is, what it trained, how good it is (`ModelSpec`)
    v000001/model.safetensors    its weights (no pickle)
    v000002/...

A version is written into a hidden temporary directory beside the others (`.v000002-*`), both files fsynced,
then renamed to `v000002` and the parent fsynced: a reader sees a complete version or none, whatever the moment
of a crash, on local storage or any POSIX filesystem every node mounts. Leftover temporaries of a crashed writer
are removed by a later write once they are an hour old (a writer still at work on one is never that slow). The
newest version is the highest number: there is no pointer file to update (and so none to tear).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from ..durable import fsync_dir, write_synced
from .errors import VersionError
from .spec import SPEC_FILE, WEIGHTS_FILE, ModelSpec

__all__ = ["latest_version", "next_version", "prune_versions", "read_version", "resolve_version", "version_dirs",
           "version_name", "write_version"]

logger = logging.getLogger(__name__)

_VERSION_DIR = re.compile(r"^v(\d{6,})$")
_TMP_PREFIX = ".v"

#: A temporary directory this old was left by a crashed writer (one that is writing takes seconds).
STALE_AFTER_S = 3600.0


def version_name(version: int) -> str:
    """The directory name of a version: v000001, ..."""
    return f"v{version:06d}"


def version_dirs(root: Path) -> list[tuple[int, Path]]:
    """The complete versions under `root`, oldest first (an absent `root` holds none)."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), entry) for entry in root.iterdir()
             if (m := _VERSION_DIR.match(entry.name)) and entry.is_dir()]
    return sorted(found)


def latest_version(root: Path) -> int | None:
    """The highest version number under `root`, or None when there is none."""
    found = version_dirs(root)
    return found[-1][0] if found else None


def next_version(root: Path) -> int:
    """The number the next version written under `root` gets."""
    return (latest_version(root) or 0) + 1


def _non_finite(state: Mapping[str, torch.Tensor]) -> list[str]:
    return [k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]


def write_version(root: Path, spec: ModelSpec, state: Mapping[str, torch.Tensor], keep: int | None = None) -> Path:
    """Write one version atomically under `root` and keep the newest `keep`.

    Args:
        root: The model directory (created when missing).
        spec: What the version is; its weights checksum is filled in here.
        state: The model's state_dict (any device; copied to the CPU).
        keep: Versions to keep (None: all).

    Returns:
        The version's directory.

    Raises:
        VersionError: a weight is NaN or infinite (nothing is written), or the version exists already.
        OSError: the directory is not writable or the disk is full (nothing is left half-written).
    """
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}  # clone: no shared storage
    bad = _non_finite(tensors)
    if bad:
        raise VersionError(f"version {spec.version} not written: {len(bad)} weight(s) hold NaN or infinity "
                           f"({', '.join(bad[:5])})")
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale(root)
    final = root / version_name(spec.version)
    if final.exists():
        raise VersionError(f"{final} exists already: version {spec.version} was written before (two writers on "
                           "one model directory?)")
    weights = save_safetensors(tensors, metadata={"format": "pt", "job": spec.job, "version": str(spec.version)})
    spec = replace(spec, weights_sha256=hashlib.sha256(weights).hexdigest())
    tmp = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{spec.version:06d}-", dir=root))
    try:
        write_synced(tmp / WEIGHTS_FILE, weights)
        write_synced(tmp / SPEC_FILE, spec.dumps().encode())
        fsync_dir(tmp)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(root)
    if keep is not None:
        prune_versions(root, keep)
    return final


def _remove_stale(root: Path) -> None:
    """Remove what crashed writers left (never renamed, so never read); not another writer's work in progress."""
    now = time.time()
    for stale in root.glob(f"{_TMP_PREFIX}*"):
        with contextlib.suppress(OSError):
            if now - stale.stat().st_mtime > STALE_AFTER_S:
                shutil.rmtree(stale, ignore_errors=True)


def prune_versions(root: Path, keep: int) -> list[int]:
    """Delete all but the newest `keep` versions under `root`; returns the numbers deleted."""
    found = version_dirs(root)
    gone = found[: max(0, len(found) - keep)]
    for number, path in gone:
        # Renamed out of the version namespace first, so a reader never sees a version half deleted.
        doomed = path.with_name(f"{_TMP_PREFIX}{number:06d}-deleted")
        try:
            os.rename(path, doomed)
        except OSError:
            continue  # another writer's prune got it first
        shutil.rmtree(doomed, ignore_errors=True)
    if gone:
        logger.debug("deleted versions %s of %s (keeping %d)", [n for n, _ in gone], root, keep)
    return [n for n, _ in gone]


def _version_number(version: int | str) -> int | None:
    """`version` as a number (None: "latest")."""
    if version == "latest":
        return None
    try:
        if isinstance(version, bool):
            raise ValueError
        return int(version)
    except (TypeError, ValueError):
        raise VersionError(f"version {version!r}: give 'latest' or a version number") from None


def resolve_version(path: Path, version: int | str = "latest") -> Path:
    """The directory of one version: `path` itself when it is a version (its directory, or a file in it), else
    `path`'s version `version`.

    Args:
        path: A version's directory or its model.json (or model.safetensors), or a model directory of versions.
        version: "latest" or a version number; a version's own directory holds that version only.

    Raises:
        VersionError: `path` does not exist, holds no version, or not that one.
    """
    number = _version_number(version)
    if path.is_file() and path.name in (SPEC_FILE, WEIGHTS_FILE):
        path = path.parent
    if (path / SPEC_FILE).is_file():
        if number is not None:
            _check_own_version(path, number)
        return path
    if not path.exists():
        raise VersionError(f"{path}: no such file or directory")
    found = dict(version_dirs(path))
    if not found:
        raise VersionError(f"{path}: neither a model version (a directory holding {SPEC_FILE} and {WEIGHTS_FILE}) "
                           "nor a model directory (holding v000001/, ...: versions.dir)")
    if number is None:
        return found[max(found)]
    if number not in found:
        raise VersionError(f"{path}: no version {number} (there are {', '.join(map(str, sorted(found)))})")
    return found[number]


def _check_own_version(directory: Path, number: int) -> None:
    """Refuse to read version `number` from a version's directory that is another version."""
    try:
        own = json.loads((directory / SPEC_FILE).read_text()).get("version")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return  # read_version names what is wrong with the file
    if own != number:
        raise VersionError(f"{directory} is version {own} (a version's own directory), not version {number}: to "
                           "pick a version by number, give the model directory that holds them (versions.dir, "
                           "e.g. <out>/versions of streamtrain up)")


def read_version(directory: Path) -> tuple[ModelSpec, dict[str, torch.Tensor]]:
    """Read one version's spec and weights, checked against each other.

    Raises:
        VersionError: a file is missing, model.json is not valid (the field is named), or the weights are torn,
            corrupt or not the ones model.json describes (checksum).
    """
    spec_path, weights_path = directory / SPEC_FILE, directory / WEIGHTS_FILE
    try:
        doc = json.loads(spec_path.read_text())
    except FileNotFoundError:
        raise VersionError(f"{spec_path}: missing") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise VersionError(f"{spec_path}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise VersionError(f"{spec_path}: not a JSON object")
    try:
        spec = ModelSpec.from_json(doc)
    except VersionError as exc:
        raise VersionError(f"{directory}/{exc}") from None
    try:
        data = weights_path.read_bytes()
    except FileNotFoundError:
        raise VersionError(f"{weights_path}: missing") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != spec.weights_sha256:
        raise VersionError(f"{weights_path}: its SHA-256 {digest[:12]}... is not the {spec.weights_sha256[:12]}... "
                           f"{SPEC_FILE} says (weights.sha256): the file is corrupt or was replaced")
    try:
        tensors = load_safetensors(data)
    except (SafetensorError, ValueError, RuntimeError) as exc:
        raise VersionError(f"{weights_path}: not a safetensors file ({exc})") from None
    return spec, tensors
