"""The README's "Train on it" snippets run as written, against the shipped sample data built in core."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from prep_assets.core.spec import load_spec
from prep_assets_tests.conftest import PROJECT, copy_sample_data
from prep_assets_tests.core.helpers import run_core


def _snippet(containing: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", (PROJECT / "README.md").read_text(encoding="utf-8"), flags=re.S)
    (block,) = [b for b in blocks if containing in b]
    return block


def test_the_export_locations_snippet_finds_every_trainer_format_of_the_sample(tmp_path: Path, monkeypatch):
    data = copy_sample_data(tmp_path / "data")
    spec = load_spec(data / "datasets" / "sample_text.yaml", data)
    run_core(data, spec)
    monkeypatch.chdir(tmp_path)  # the snippet's paths are relative to the project
    scope: dict = {}
    exec(_snippet("megatron_prefixes"), scope)  # noqa: S102 - the README's own code
    drops = len(list((data / "raw" / "sample_text").iterdir()))
    assert drops == 2 == len(scope["megatron_prefixes"]) == len(scope["gpt_simple_dirs"]) == len(scope["gdp_folders"])
    assert all(prefix.with_suffix(".bin").is_file() for prefix in scope["megatron_prefixes"])
    assert all({p.suffix for p in d.iterdir()} == {".bin", ".idx"} for d in scope["gpt_simple_dirs"])
    assert all((folder / "metadata.yaml").is_file() for folder in scope["gdp_folders"])


def test_the_pytorch_snippet_names_what_the_loader_exports():
    pytest.importorskip("torch", reason="the PyTorch loader needs the [torch] extra")
    code = _snippet("PackedIterableDataset")
    import prep_assets.torch as loader

    for name in re.findall(r"from prep_assets\.torch import (.*)", code)[0].split(", "):
        assert hasattr(loader, name.strip()), name
