"""Shared fixtures: real data and tokenizers from ../shared (skipped with a reason where absent)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from prep_assets.core.spec import DatasetSpec, parse_spec

PROJECT = Path(__file__).resolve().parents[1]
SHARED = PROJECT.parent / "shared"
SAMPLE_DATA = PROJECT / "data"


def shared_path(rel: str) -> Path:
    path = SHARED / rel
    if not path.exists():
        pytest.skip(f"needs ../shared/{rel} (the shared datasets/tokenizers folder beside the clone), absent here")
    return path


@pytest.fixture
def gpt2_dir() -> Path:
    return shared_path("tokenizers/gpt2")


def make_spec(name: str = "ds", **sections: Any) -> DatasetSpec:
    raw: dict[str, Any] = {"input": {"type": "text"}, "tokenizer": {"path": "/nonexistent"}}
    raw.update(sections)
    return parse_spec(raw, path=Path(f"{name}.yaml"), default_name=name)


def write_dataset(data_dir: Path, name: str, spec: dict[str, Any], files: list[Path] | dict[str, bytes]) -> Path:
    """A data dir with datasets/<name>.yaml and raw/<name>/ holding the given files."""
    (data_dir / "datasets").mkdir(parents=True, exist_ok=True)
    (data_dir / "datasets" / f"{name}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    raw = data_dir / "raw" / name
    raw.mkdir(parents=True, exist_ok=True)
    if isinstance(files, dict):
        for fname, data in files.items():
            (raw / fname).write_bytes(data)
    else:
        for f in files:
            shutil.copyfile(f, raw / f.name)
    return data_dir


def copy_sample_data(dest: Path) -> Path:
    """The shipped sample data (specs, raw drops, tokenizer corpus), without any lake outputs."""
    for sub in ("datasets", "raw", "corpus", "templates"):
        shutil.copytree(SAMPLE_DATA / sub, dest / sub)
    return dest


def tree_digests(root: Path, *, skip_hidden_names: bool = False) -> dict[str, str]:
    """The sha256 of every file below `root`, keyed by its path relative to `root` (with `skip_hidden_names`,
    files whose own name starts with "." are left out)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not (skip_hidden_names and p.name.startswith("."))
    }


@pytest.fixture
def dagster_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n", encoding="utf-8")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return home
