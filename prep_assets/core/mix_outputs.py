"""What a mix writes for trainers beside mix.json, when its spec's `outputs` ask (docs/mixes.md):

- `megatron_blend`: `megatron_blend.txt`, per phase Megatron's `--data-path w1 prefix1 w2 prefix2 …` over the
  sources' Megatron `.bin/.idx` prefixes (paths relative to the lake). A bucket of several drops has a prefix per
  drop; the bucket's share of the phase is divided among them by their tokens. Megatron normalizes the weights.
- `gpt_simple_curriculum`: `gpt_simple/train/<bucket>/` and `gpt_simple/val/<bucket>/`, hard links (copies across
  file systems) of the sources' `gpt_simple` train and validation files, and `gpt_simple/curriculum.yaml` with the
  phases as GPT-Simple's `data.curriculum` (`duration_tokens`, `mix`). GPT-Simple has no epochs: a bucket with
  `max_epochs` k holds its train files k times (`e<k>-` names), so its validator counts the inventory the mix may
  use. GPT-Simple counts a bucket's tokens from its `.idx` files (documents and their EOD, not rows × max_seq_len)
  and demands share × duration_tokens; `curriculum_demand` computes the same figures for the inventory gate.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Literal

import yaml

from prep_assets.core.errors import PrepAssetsError

Output = Literal["megatron_blend", "gpt_simple_curriculum"]
MEGATRON_BLEND = "megatron_blend.txt"
GPT_SIMPLE_DIR = "gpt_simple"
CURRICULUM = "curriculum.yaml"
_SPLIT_DIRS = {"train": "train", "validation": "val"}  # our split -> GPT-Simple's folder


class MixOutputError(PrepAssetsError):
    """A mix asks for an output its sources cannot give (no Megatron or GPT-Simple export, a domain bucket)."""


def _exports(manifest: dict[str, Any], split: str, fmt: str) -> list[dict[str, Any]]:
    return [e for e in manifest["splits"].get(split, {}).get("exports", []) if e["format"] == fmt]


def _whole_datasets(mix: dict[str, Any], output: str, fmt: str) -> None:
    narrowed = sorted(b for b, s in mix["sources"].items() if "domains" in s)
    if narrowed:
        raise MixOutputError(
            f"outputs {output}: bucket(s) {narrowed} narrow to domains, but a dataset's {fmt} files hold every "
            "domain's documents together; drop `domains` there or this output"
        )


def _missing(manifests: dict[str, dict[str, Any]], mix: dict[str, Any], output: str, fmt: str) -> None:
    missing = [b for b in mix["sources"] if not _exports(manifests[b], mix["split"], fmt)]
    if missing:
        names = ", ".join(f"{b} ({mix['sources'][b]['dataset']})" for b in missing)
        raise MixOutputError(
            f"outputs {output}: source(s) {names} write no {fmt} output: add {fmt} to their output.formats "
            "and rebuild them, or drop this output"
        )


def megatron_blend(mix: dict[str, Any], manifests: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per phase the `[weight, prefix]` pairs of Megatron's `--data-path` (weights: the bucket's share of the phase
    split over its drops by tokens, rounded to 9 digits; buckets without weight left out)."""
    _whole_datasets(mix, "megatron_blend", "megatron")
    _missing(manifests, mix, "megatron_blend", "megatron")
    phases = {}
    for phase in mix["phases"]:
        pairs = []
        for b, figures in phase["buckets"].items():
            entries = _exports(manifests[b], mix["split"], "megatron")
            total = sum(e["tokens"] for e in entries)
            if figures["share"] <= 0 or total <= 0:
                continue
            dataset = mix["sources"][b]["dataset"]
            pairs += [[round(figures["share"] * e["tokens"] / total, 9), f"{dataset}/{e['prefix']}"] for e in entries]
        phases[phase["name"]] = pairs
    return {"path": MEGATRON_BLEND, "phases": phases}


def megatron_blend_text(mix_name: str, blend: dict[str, Any], durations: dict[str, int]) -> str:
    lines = [
        f"# Megatron --data-path of training mix {mix_name!r}, one line per phase (weights are the phase's planned",
        "# shares; Megatron normalizes them). Prefixes are relative to the lake: run from it, or prepend its path.",
    ]
    for name, pairs in blend["phases"].items():
        lines.append(f"# phase {name}: {durations[name]} tokens")
        lines.append("--data-path " + " ".join(f"{w!r} {prefix}" for w, prefix in pairs))
    return "\n".join(lines) + "\n"


def gpt_simple_layout(mix: dict[str, Any], manifests: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The curriculum layout's files (`gpt_simple/<train|val>/<bucket>/<name>` -> the source file, relative to the
    lake), each bucket's train tokens as GPT-Simple counts them, and the `data` section of its config."""
    _whole_datasets(mix, "gpt_simple_curriculum", "gpt_simple")
    _missing(manifests, mix, "gpt_simple_curriculum", "gpt_simple")
    files: dict[str, str] = {}
    tokens: dict[str, int] = {}
    for b, src in mix["sources"].items():
        dataset = src["dataset"]
        for split, folder in _SPLIT_DIRS.items():
            epochs = src["max_epochs"] if split == "train" else 1
            entries = _exports(manifests[b], split, "gpt_simple")
            for k in range(epochs):
                for e in entries:
                    for f in e["files"]:
                        name = f["path"].rsplit("/", 1)[1]
                        prefix = f"{dataset}-" if k == 0 else f"{dataset}-e{k}-"
                        files[f"{GPT_SIMPLE_DIR}/{folder}/{b}/{prefix}{name}"] = f"{dataset}/{f['path']}"
            if split == "train":
                tokens[b] = epochs * sum(e["tokens"] for e in entries)
    curriculum = [
        {"duration_tokens": p["duration_tokens"], "mix": {b: f["weight"] for b, f in p["buckets"].items()}}
        for p in mix["phases"]
    ]
    data = {
        "path": ".",  # the folder holding curriculum.yaml
        "format": "pretokenized",
        "max_length": mix["max_seq_len"],
        "overlap_size": 0,  # GPT-Simple windows at load time only from JSONL; our files carry their windows
        "curriculum": curriculum,
        "allow_bucket_exhaustion": mix["allow_bucket_exhaustion"],
    }
    return {"dir": GPT_SIMPLE_DIR, "config": f"{GPT_SIMPLE_DIR}/{CURRICULUM}", "files": files, "tokens": tokens,
            "data": data}  # fmt: skip


def curriculum_demand(mix: dict[str, Any]) -> dict[str, tuple[float, int, float]]:
    """GPT-Simple's shortfall figures (`validate._compute_curriculum_demand`): per bucket whose cumulative demand
    (Σ phase share × duration_tokens, in phase order) exceeds its tokens on disk, (demand, available, shortfall)."""
    layout = mix["outputs"]["gpt_simple_curriculum"]
    cumulative: dict[str, float] = {}
    for phase in layout["data"]["curriculum"]:
        total = sum(phase["mix"].values())
        for b, w in phase["mix"].items():
            cumulative[b] = cumulative.get(b, 0.0) + w / total * phase["duration_tokens"]
    out = {}
    for b, demand in cumulative.items():
        available = layout["tokens"].get(b, 0)
        if demand > available:
            out[b] = (demand, available, demand - available)
    return out


def write_outputs(mix: dict[str, Any], lake: Path, folder: Path) -> None:
    """Write the outputs `mix["outputs"]` describes into the mix's (staging) folder."""
    outputs = mix.get("outputs", {})
    if "megatron_blend" in outputs:
        durations = {p["name"]: p["duration_tokens"] for p in mix["phases"]}
        text = megatron_blend_text(mix["mix"], outputs["megatron_blend"], durations)
        (folder / MEGATRON_BLEND).write_text(text, encoding="utf-8")
    if "gpt_simple_curriculum" in outputs:
        layout = outputs["gpt_simple_curriculum"]
        root = folder / GPT_SIMPLE_DIR
        for b in mix["sources"]:  # GPT-Simple wants every bucket in train/ and val/, even an empty one
            for split_dir in _SPLIT_DIRS.values():
                (root / split_dir / b).mkdir(parents=True, exist_ok=True)
        for dest, source in sorted(layout["files"].items()):
            _link(lake / source, folder / dest)
        doc = {"data": layout["data"]}
        (folder / layout["config"]).write_text(
            "# GPT-Simple's data section for this mix: its pretokenized layout (data.path: this folder; run from it\n"
            "# or give its absolute path) and the phases as data.curriculum (GPT-Simple normalizes the weights).\n"
            + yaml.safe_dump(doc, sort_keys=True),
            encoding="utf-8",
        )


def _link(source: Path, dest: Path) -> None:
    """A hard link (the bytes once on disk), a copy where the file system refuses one."""
    try:
        os.link(source, dest)
    except OSError:
        shutil.copyfile(source, dest)
