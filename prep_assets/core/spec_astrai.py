"""AstrAI pipeline configs (`pipeline.json`, `version: 1`) read as dataset specs.

AstrAI's `scripts/tools/preprocess.py -c <config>.json` takes one JSON file describing input, mask and
preprocessing; dropped into `data/datasets/<name>.json` it is translated here into our spec, key by key
(docs/spec.md, "AstrAI pipeline configs"). The config's schema is strict like ours: a key AstrAI has that we cannot
honour (its packing, position ids, dtypes, `h5`/`jsonl` storage) is an error naming it, never ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from prep_assets.core.spec_sections import MaskAction, TokenizerSpec, _Strict

ASTRAI_TOKENIZER = "params"  # AstrAI's `--tokenizer_path` default, here relative to the data dir


class AstraiInput(_Strict):
    type: Literal["chat", "instruction", "text"] = "chat"
    messages_key: str = "messages"
    prompt_key: str = "prompt"
    response_key: str = "response"
    text_key: str = "text"


class AstraiPreprocessing(_Strict):
    max_seq_len: int = Field(default=2048, ge=8)
    min_chars: int = Field(default=50, ge=0)  # text mode only, as in AstrAI
    max_chars: int = Field(default=2_000_000, ge=1)
    deduplicate: bool = True
    max_items: int | None = Field(default=None, ge=1)
    truncation_mode: Literal["keep_start", "keep_end"] = "keep_start"


class AstraiOutput(_Strict):
    domain_key: str | None = None
    storage_format: Literal["bin"] = "bin"  # AstrAI's h5/jsonl stores are not written here
    max_tokens_per_shard: int = Field(default=100_000_000, ge=8)


class AstraiConfig(_Strict):
    """An AstrAI `PipelineConfig` (JSON), plus the two things AstrAI takes from its command line instead."""

    version: Literal[1] = 1
    input: AstraiInput = AstraiInput()
    mask: dict[str, MaskAction] = {}
    mask_default: MaskAction = "mask"
    preprocessing: AstraiPreprocessing = AstraiPreprocessing()
    output: AstraiOutput = AstraiOutput()
    # not AstrAI keys: its CLI passes `--tokenizer_path` (default `params`); a description is ours
    tokenizer: TokenizerSpec = TokenizerSpec(path=ASTRAI_TOKENIZER)
    description: str = ""


def is_astrai(raw: Any) -> bool:
    """A JSON spec is an AstrAI config when it carries AstrAI's `version` or `preprocessing` key."""
    return isinstance(raw, dict) and ("version" in raw or "preprocessing" in raw)


def spec_from_astrai(cfg: AstraiConfig) -> dict[str, Any]:
    """Our spec (as a raw mapping, validated by `DatasetSpec` after) meaning what AstrAI does with `cfg`."""
    inp, pre, out = cfg.input, cfg.preprocessing, cfg.output
    source: dict[str, Any] = {"type": inp.type}
    if inp.type == "chat":
        source["messages_key"] = inp.messages_key
    elif inp.type == "instruction":
        source.update(prompt_key=inp.prompt_key, completion_key=inp.response_key)
    else:
        source["text_key"] = inp.text_key
    if out.domain_key is not None:
        source["domain_key"] = out.domain_key
    # AstrAI's instruction field is `response`; ours is `completion`
    mask = {("completion" if k == "response" and inp.type == "instruction" else k): v for k, v in cfg.mask.items()}
    clean: dict[str, Any] = {"dedup": "exact" if pre.deduplicate else "none", "max_items": pre.max_items}
    if inp.type == "text":  # AstrAI filters by length in text mode only
        clean.update(min_chars=pre.min_chars, max_chars=pre.max_chars)
    overflow = "truncate_right" if pre.truncation_mode == "keep_start" else "truncate_left"
    return {
        "description": cfg.description,
        "input": source,
        "mask": mask,
        "mask_default": cfg.mask_default,
        "clean": clean,
        "tokenizer": cfg.tokenizer.model_dump(exclude_defaults=True),
        "sequence": {"max_seq_len": pre.max_seq_len, "overflow": overflow},
        "output": {"formats": ["parquet", "astrai_bin"], "max_tokens_per_shard": out.max_tokens_per_shard},
    }
