"""Shared fixtures: real data and tokenizers from ../shared (skipped with a reason where absent)."""

from __future__ import annotations

import hashlib
import json
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
    """The shipped sample data (specs, mixes, raw drops, tokenizer corpus), without any lake outputs."""
    for sub in ("datasets", "mixes", "raw", "corpus", "templates"):
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


# ---------------------------------------------------------------- packed lakes for the loader tests

# instruction, chat and text records of ../shared (the first `take` of each), packed at a small max_seq_len with
# TinyLlama's tokenizer; `window` keeps long examples as continued segments, whose starts the loader must mask
PACKED_SOURCES = {
    "instruct": ("instruction/gdp_generative_tuning.jsonl", 100, {"type": "instruction"}),
    "chat": ("chat/fastchat_dummy_conversation.json", 60, {"type": "chat"}),
    "text": ("text/c4_demo.jsonl", 12, {"type": "text"}),
}
PACKED_LEN = 128


def write_head(src: Path, dest_dir: Path, take: int) -> Path:
    """The first `take` records of a JSON array or JSONL file, written in the same format under `dest_dir`."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / src.name
    if src.suffix == ".json":
        dest.write_text(json.dumps(json.loads(src.read_text(encoding="utf-8"))[:take]), encoding="utf-8")
    else:
        lines = src.read_text(encoding="utf-8").splitlines(keepends=True)
        dest.write_text("".join(lines[:take]), encoding="utf-8")
    return dest


def build_packed_lake(data_dir: Path, name: str, tokenizer: str = "tinyllama", max_seq_len: int = PACKED_LEN) -> Path:
    """Every layer and the manifest of PACKED_SOURCES[name] built in core; returns the manifest's path."""
    from prep_assets_tests.core.helpers import run_core  # imports every layer: only where a lake is built

    rel, take, inp = PACKED_SOURCES[name]
    write_head(shared_path(f"datasets/{rel}"), data_dir / "raw" / name, take)
    spec = make_spec(
        name,
        input=inp,
        tokenizer={"path": str(shared_path(f"tokenizers/{tokenizer}"))},
        sequence={"max_seq_len": max_seq_len, "overflow": "window"},
        split={"validation_ratio": 0.1},
    )
    run_core(data_dir, spec)
    return data_dir / "lake" / name / "manifest.json"


@pytest.fixture(scope="session")
def packed_lakes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The manifest of each PACKED_SOURCES dataset (one data dir), built once per session."""
    data_dir = tmp_path_factory.mktemp("packed")
    return {name: build_packed_lake(data_dir, name) for name in PACKED_SOURCES}


@pytest.fixture
def hf_datasets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """HF `datasets`, offline, its caches under `tmp_path` (its config reads the environment once, at import, so the
    paths are patched there too); skipped with a reason where it is not installed."""
    datasets = pytest.importorskip("datasets", reason="needs HF datasets: pip install datasets")
    cache = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(cache))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    for name, sub in (
        ("HF_DATASETS_CACHE", "datasets"),
        ("HF_MODULES_CACHE", "modules"),
        ("DOWNLOADED_DATASETS_PATH", "datasets/downloads"),
        ("EXTRACTED_DATASETS_PATH", "datasets/downloads/extracted"),
    ):
        monkeypatch.setattr(datasets.config, name, cache / sub)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    return datasets
