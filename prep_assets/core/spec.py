"""Dataset specs: one YAML file per dataset, validated on load.

A spec is declarative like a training config. Unknown keys, wrong types and missing required
fields are errors that name the file, the key path and what is allowed there.
"""

from __future__ import annotations

import glob
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from prep_assets.core.errors import SpecError

DATASET_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")

InputFormat = Literal["auto", "jsonl", "jsonl.gz", "json", "txt", "csv", "parquet"]
RecordType = Literal["text", "instruction", "chat", "preference", "tabular"]
TabularMode = Literal["flat", "grouped", "sequential"]
ColumnType = Literal["string", "int", "float"]
AUTO_MAX_SEQUENCES = 10  # `max_sequences_per_example: auto` (Safe Synthesizer's default without DP)
MaskAction = Literal["train", "mask"]
Overflow = Literal["drop", "truncate_right", "truncate_left", "window"]
PackingStrategy = Literal["bfd", "ffd", "full", "single"]
Layer = Literal["bronze", "silver", "gold", "shards"]

# Which file suffixes each concrete format reads; `auto` picks by suffix.
FORMAT_SUFFIXES: dict[str, tuple[str, ...]] = {
    "jsonl.gz": (".jsonl.gz", ".ndjson.gz"),
    "jsonl": (".jsonl", ".ndjson"),
    "json": (".json",),
    "txt": (".txt",),
    "csv": (".csv",),
    "parquet": (".parquet",),
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


class InputSpec(_Strict):
    format: InputFormat = "auto"
    type: RecordType
    text_key: str = "text"
    prompt_key: str | list[str] = "prompt"
    completion_key: str = "completion"
    prompt_separator: str = "\n\n"
    prompt_prefix: str = ""
    prompt_postfix: str = ""
    # chat / preference: where the conversation is and how its roles are named (None = detect per record:
    # `messages` with role/content, or `conversations` with from/value, or a list of prompt/completion pairs)
    messages_key: str | None = None
    role_key: str | None = None
    content_key: str | None = None
    role_map: dict[str, str] = {}
    system_key: str = "system"
    tools_key: str = "tools"
    chosen_key: str = "chosen"
    rejected_key: str = "rejected"
    max_line_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    max_gzip_ratio: float = Field(default=100.0, gt=1)  # decompressed / compressed bytes (floor 256 MiB)

    @model_validator(mode="after")
    def _check_keys(self) -> InputSpec:
        if isinstance(self.prompt_key, list) and not self.prompt_key:
            raise ValueError("prompt_key: give a key or a non-empty list of keys")
        return self

    @property
    def roles(self) -> dict[str, str]:
        """Source role name -> chat role: the defaults, overridden by `role_map`."""
        return {**DEFAULT_ROLE_MAP, **self.role_map}

    @property
    def prompt_keys(self) -> tuple[str, ...]:
        return (self.prompt_key,) if isinstance(self.prompt_key, str) else tuple(self.prompt_key)


CHAT_ROLES = ("system", "user", "assistant", "tool")
DEFAULT_ROLE_MAP: dict[str, str] = {
    **{r: r for r in CHAT_ROLES},
    "human": "user",
    "gpt": "assistant",
    "function_call": "assistant",
    "observation": "tool",
}


class NormalizeSpec(_Strict):
    nfc: bool = True
    newlines: bool = True
    control_chars: bool = True
    trailing_whitespace: bool = True


class QualitySpec(_Strict):
    """Gopher/C4-style heuristics over a record's text (its text fields joined by newlines); each off when null."""

    min_words: int | None = Field(default=None, ge=1)
    max_repeated_line_fraction: float | None = Field(default=None, ge=0, le=1)  # repeated lines / lines
    max_repeated_ngram_fraction: float | None = Field(default=None, ge=0, le=1)  # chars in repeated word n-grams
    repeated_ngram_size: int = Field(default=5, ge=1, le=20)
    max_non_alnum_fraction: float | None = Field(default=None, ge=0, le=1)  # non-alphanumeric, non-space chars

    @property
    def enabled(self) -> bool:
        """Is any heuristic on? (Each is a field that is null when off; `repeated_ngram_size` only sets one up.)"""
        return any(
            getattr(self, name) is not None for name in type(self).model_fields if name != "repeated_ngram_size"
        )


class NearDedupSpec(_Strict):
    """MinHash + LSH near-duplicate removal (`dedup: near`): a record whose estimated Jaccard similarity with a
    kept record reaches `threshold` is removed."""

    threshold: float = Field(default=0.7, gt=0, le=1)
    unit: Literal["word", "char"] = "word"
    ngram: int = Field(default=3, ge=1, le=50)
    num_perm: int = Field(default=128, ge=16, le=1024)
    seed: int = 1


class CleanSpec(_Strict):
    normalize: NormalizeSpec | bool = True
    min_chars: int = Field(default=1, ge=0)
    max_chars: int | None = Field(default=None, ge=1)
    quality: QualitySpec = QualitySpec()
    dedup: Literal["exact", "near", "none"] = "exact"  # near: exact first, then near-duplicates
    dedup_scope: Literal["drop", "dataset"] = "drop"
    near: NearDedupSpec = NearDedupSpec()
    # keep records whose trained turn (completion, assistant message) is empty or whitespace only
    keep_empty_turns: bool = False

    @model_validator(mode="after")
    def _scope_needs_dedup(self) -> CleanSpec:
        if self.dedup_scope == "dataset" and self.dedup == "none":
            raise ValueError("clean.dedup_scope: dataset needs clean.dedup: exact or near (tables default to none)")
        return self

    @property
    def normalization(self) -> NormalizeSpec:
        if isinstance(self.normalize, NormalizeSpec):
            return self.normalize
        if self.normalize:
            return NormalizeSpec()
        return NormalizeSpec(nfc=False, newlines=False, control_chars=False, trailing_whitespace=False)


class TrainTokenizerSpec(_Strict):
    files: list[str] = Field(min_length=1)
    vocab_size: int = Field(default=4096, ge=300, le=1_000_000)
    min_frequency: int = Field(default=2, ge=1)
    special_tokens: list[str] = ["<|endoftext|>", "<|pad|>"]
    eos_token: str = "<|endoftext|>"
    pad_token: str | None = "<|pad|>"
    bos_token: str | None = None

    @model_validator(mode="after")
    def _specials_listed(self) -> TrainTokenizerSpec:
        for name in ("eos_token", "pad_token", "bos_token"):
            value = getattr(self, name)
            if value is not None and value not in self.special_tokens:
                raise ValueError(f"{name} {value!r} must be one of special_tokens {self.special_tokens}")
        return self


class TokenizerSpec(_Strict):
    path: str | None = None
    hub_id: str | None = None
    revision: str | None = None
    train: TrainTokenizerSpec | None = None
    add_bos: bool | None = None
    add_eos: bool = True
    # a chat template for tokenizers without one (or to replace theirs): inline Jinja, or a file
    chat_template: str | None = None
    chat_template_file: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> TokenizerSpec:
        given = [k for k in ("path", "hub_id", "train") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of path, hub_id, train (got {given or 'none'})")
        if self.chat_template is not None and self.chat_template_file is not None:
            raise ValueError("give chat_template (inline) or chat_template_file, not both")
        if self.hub_id is not None and not self.revision:
            raise ValueError("hub_id needs a revision (a commit sha or tag) so the tokenizer is pinned")
        return self


class SequenceSpec(_Strict):
    max_seq_len: int = Field(default=2048, ge=8, le=1_048_576)
    overflow: Overflow = "drop"
    # window: tokens each window repeats from the previous one (masked); at most max_seq_len / 2
    overlap: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _overlap(self) -> SequenceSpec:
        if self.overlap and self.overflow != "window":
            raise ValueError("overlap applies only to overflow: window")
        if 2 * self.overlap > self.max_seq_len:
            raise ValueError(f"overlap {self.overlap} must be at most max_seq_len / 2 ({self.max_seq_len // 2})")
        return self


class PackingSpec(_Strict):
    strategy: PackingStrategy = "bfd"
    # examples per row; for tabular data, records (flat, sequential) or groups (grouped) per example.
    # `auto` = 10; unset = no limit, except for tabular data where unset means `auto`.
    max_sequences_per_example: int | Literal["auto"] | None = None

    @model_validator(mode="after")
    def _per_example(self) -> PackingSpec:
        n = self.max_sequences_per_example
        if isinstance(n, int) and not isinstance(n, bool) and n < 1:
            raise ValueError("max_sequences_per_example must be at least 1 (or auto)")
        return self

    seed: int = 0
    shuffle: bool = True


class TabularSpec(_Strict):
    """How table rows become training examples (docs/spec.md, "Tabular data"). The mode follows from the keys when
    not given: sequential with `time_series: true`, grouped with `group_by`, else flat."""

    mode: TabularMode | None = None
    time_series: bool = False  # sequential; takes priority over grouped when group_by is set
    group_by: str | None = None
    order_by: str | None = None
    # CSV cells: which strings are missing values, and column types overriding the inference
    null_values: list[str] = [""]
    column_types: dict[str, ColumnType] = {}
    # the tokens wrapping each unit of records; default: the tokenizer's BOS (its EOS if it has none) and EOS
    bos_token: str | None = None
    eos_token: str | None = None

    @model_validator(mode="after")
    def _keys(self) -> TabularSpec:
        mode = self.resolved_mode
        if self.mode is not None and self.time_series and self.mode != "sequential":
            raise ValueError(f"time_series: true makes the mode sequential, but mode is {self.mode}")
        if mode == "sequential" and (self.group_by is None or self.order_by is None):
            raise ValueError("sequential mode (time series) needs group_by and order_by")
        if mode == "grouped" and self.group_by is None:
            raise ValueError("grouped mode needs group_by")
        if mode == "flat" and (self.group_by is not None or self.order_by is not None):
            raise ValueError("flat mode shuffles single records: group_by/order_by need mode grouped or sequential")
        return self

    @property
    def resolved_mode(self) -> TabularMode:
        if self.time_series or self.mode == "sequential":
            return "sequential"
        if self.mode is not None:
            return self.mode
        return "grouped" if self.group_by is not None else "flat"


class SplitSpec(_Strict):
    validation_ratio: float = Field(default=0.0, ge=0.0, le=1.0)
    test_ratio: float = Field(default=0.0, ge=0.0, le=1.0)
    seed: int = 0

    @model_validator(mode="after")
    def _sum(self) -> SplitSpec:
        if self.validation_ratio + self.test_ratio >= 1.0:
            raise ValueError("validation_ratio + test_ratio must be below 1 (something must train)")
        return self


class OutputSpec(_Strict):
    # parquet always; npy: flat memmap arrays + meta.json; megatron: .bin/.idx of gold documents (text only)
    formats: list[str] = ["parquet"]  # names registered in core/formats.py
    max_tokens_per_shard: int = Field(default=50_000_000, ge=8)
    compression: Literal["zstd", "snappy", "none"] = "zstd"


class ChecksSpec(_Strict):
    max_reject_rate: float = Field(default=0.05, ge=0.0, le=1.0)
    # gold rejects / silver records of a drop (records that could not become a training example)
    max_gold_reject_rate: float = Field(default=0.05, ge=0.0, le=1.0)
    min_sequence_utilization: float = Field(default=0.5, ge=0.0, le=1.0)


class DatasetSpec(_Strict):
    name: str
    description: str = ""
    input: InputSpec
    mask: dict[str, MaskAction] = {}
    mask_default: MaskAction = "mask"
    clean: CleanSpec = CleanSpec()
    tokenizer: TokenizerSpec
    sequence: SequenceSpec = SequenceSpec()
    packing: PackingSpec = PackingSpec()
    tabular: TabularSpec | None = None
    split: SplitSpec = SplitSpec()
    output: OutputSpec = OutputSpec()
    checks: ChecksSpec = ChecksSpec()

    @model_validator(mode="before")
    @classmethod
    def _tabular_defaults(cls, raw: Any) -> Any:
        """Tabular defaults: packing `single` (examples are assembled to fit one sequence each) and no dedup
        (repeated rows are data in a table)."""
        if isinstance(raw, dict) and isinstance(raw.get("input"), dict) and raw["input"].get("type") == "tabular":
            raw = {**raw, "tabular": raw.get("tabular") or {}}
            for section, key, value in (("packing", "strategy", "single"), ("clean", "dedup", "none")):
                current = raw.get(section) or {}
                if isinstance(current, dict) and key not in current:
                    raw[section] = {**current, key: value}
        return raw

    @model_validator(mode="after")
    def _consistent(self) -> DatasetSpec:
        if not DATASET_NAME_RE.match(self.name):
            raise ValueError(f"name {self.name!r}: use lower-case letters, digits and _ (starting with a letter)")
        if self.input.type not in ("text", "tabular") and self.input.format == "txt":
            raise ValueError(f"input.format txt holds one text per line; it cannot carry {self.input.type} records")
        allowed = self.mask_keys
        unknown = sorted(set(self.mask) - set(allowed))
        if unknown:
            raise ValueError(f"mask: unknown key(s) {unknown} for type {self.input.type}; allowed: {list(allowed)}")
        per_row = self.max_per_example
        if self.input.type == "preference" and per_row is not None and per_row < 2:
            raise ValueError(
                "packing.max_sequences_per_example must be at least 2 for preference data: "
                "both examples of a pair share a row"
            )
        if self.input.type == "preference" and (self.packing.strategy == "full" or self.sequence.overflow == "window"):
            raise ValueError(
                "preference pairs stay whole in one row: packing.strategy full and sequence.overflow "
                "window would split them; use bfd, ffd or single with drop or truncate_*"
            )
        if self.packing.strategy == "full" and self.sequence.overlap:
            raise ValueError(
                "sequence.overlap applies to windows (overflow: window with bfd, ffd or single); "
                "packing.strategy full cuts examples across rows without repeating tokens"
            )
        if self.input.type == "tabular":
            self._check_tabular()
        elif self.tabular is not None:
            raise ValueError(f"tabular: applies to input.type tabular, not {self.input.type}")
        from prep_assets.core import formats  # the registry imports the writers, which import this module

        for problem in formats.problems(self):
            raise ValueError(problem)
        if "parquet" not in self.output.formats:
            raise ValueError("output.formats must include parquet (the shards the gates check)")
        if self.output.max_tokens_per_shard < self.sequence.max_seq_len:
            raise ValueError("output.max_tokens_per_shard must be at least sequence.max_seq_len")
        return self

    def _check_tabular(self) -> None:
        if self.clean.dedup == "near":
            raise ValueError("clean.dedup: near compares text; table rows are data (use exact or none for tabular)")
        if self.packing.strategy != "single":
            raise ValueError(
                "tabular examples are assembled to fit one sequence each (schema prompt + records): "
                f"packing.strategy must be single, not {self.packing.strategy}"
            )
        if self.sequence.overflow != "drop":
            raise ValueError(
                "tabular records are never cut: a record or group that cannot fit is an error before "
                "any shard is written; leave sequence.overflow at drop"
            )
        if self.input.format == "txt":
            raise ValueError("tabular input reads csv, parquet, jsonl, jsonl.gz or json rows, not txt lines")

    @property
    def max_per_example(self) -> int | None:
        """`packing.max_sequences_per_example` resolved: auto = 10; unset = no limit (tabular: auto)."""
        n = self.packing.max_sequences_per_example
        if n == "auto" or (n is None and self.input.type == "tabular"):
            return AUTO_MAX_SEQUENCES
        return n

    @property
    def gold_overflow(self) -> str:
        """The overflow gold applies: `keep` (examples stay whole) where packing splits them (full, window)."""
        if self.packing.strategy == "full" or self.sequence.overflow == "window":
            return "keep"
        return self.sequence.overflow

    @property
    def splits_examples(self) -> bool:
        """Whether shards may hold an example in pieces (so gold examples may exceed max_seq_len)."""
        return self.gold_overflow == "keep"

    @property
    def shuffles_rows(self) -> bool:
        """Whether shard rows are shuffled per split: `packing.shuffle`, except sequential tables (in order)."""
        sequential = self.tabular is not None and self.tabular.resolved_mode == "sequential"
        return self.packing.shuffle and not (self.input.type == "tabular" and sequential)

    @property
    def tabular_packing(self) -> dict[str, Any] | None:
        """What tabular gold takes from `packing` (its seed and records per example); None for other types."""
        if self.input.type != "tabular":
            return None
        return {"seed": self.packing.seed, "max_per_example": self.max_per_example}

    def mask_action(self, field: str) -> MaskAction:
        """The action for a role/field: the spec's, else the type's default, else mask_default."""
        if field in self.mask:
            return self.mask[field]
        return self.mask_keys.get(field) or self.mask_default

    @property
    def mask_keys(self) -> dict[str, MaskAction | None]:
        """The mask keys this spec's type allows, with their defaults; chat roles include role_map targets."""
        keys = dict(_MASK_KEYS[self.input.type])
        if self.input.type in ("chat", "preference"):
            keys.update({r: None for r in self.input.roles.values() if r not in keys})
        return keys

    def layer_version(self, layer: str) -> str:
        """The code revision + a hash of the spec fields that shape a layer (its Dagster code version)."""
        sections = LAYER_SECTIONS[layer] if layer in LAYER_SECTIONS else (layer,)  # type: ignore[index]
        return f"{CODE_VERSION}-{self.fingerprint(*sections)[:12]}"

    def fingerprint(self, *sections: str) -> str:
        """A stable hash of the named sections (all when none; `a.b` names one key of a section, and a name
        that is no section names a derived property such as `gold_overflow`)."""
        data = self.model_dump(mode="json")

        def value(k: str) -> Any:
            if "." in k:
                section, key = k.split(".", 1)
                return data[section][key]
            return data[k] if k in data else getattr(self, k)

        chosen = {k: value(k) for k in (sections or tuple(sorted(data)))}
        blob = json.dumps(chosen, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()


# Per record type: the mask keys a spec may set, with their defaults (None = use mask_default).
_MASK_KEYS: dict[str, dict[str, MaskAction | None]] = {
    "text": {"text": "train"},
    "instruction": {"prompt": "mask", "completion": "train"},
    "chat": {"system": "mask", "user": "mask", "assistant": "train", "tool": "mask"},
    # preference: roles of the chosen/rejected branches; the shared prompt is always masked
    "preference": {"system": "mask", "user": "mask", "assistant": "train", "tool": "mask"},
    # tabular: the schema prompt is always masked, records and their BOS/EOS always trained
    "tabular": {},
}

# Which spec sections shape each layer's output: a change to one makes that layer and those below stale.
# `checks` is in every layer: a changed threshold must re-judge every partition.
# Bump when a layer's code changes what it writes: the UI then shows that layer (and below) stale, and the
# dedup indexes (keyed by silver's version) are rebuilt.
CODE_VERSION = "4"

LAYER_SECTIONS: dict[Layer, tuple[str, ...]] = {
    # tabular: bronze types CSV cells and checks group_by/order_by; silver draws splits by group
    "bronze": ("input", "checks", "tabular"),
    "silver": ("input", "checks", "clean", "split", "tabular"),
    # gold depends on the overflow it applies (keep under full/window), not on the packing strategy itself
    # tabular gold assembles examples, so it also follows the packing seed and records per example
    "gold": (
        "input",
        "checks",
        "clean",
        "split",
        "mask",
        "mask_default",
        "tokenizer",
        "sequence.max_seq_len",
        "gold_overflow",
        "tabular",
        "tabular_packing",
    ),
    "shards": (
        "input",
        "checks",
        "clean",
        "split",
        "mask",
        "mask_default",
        "tokenizer",
        "sequence",
        "packing",
        "output",
        "tabular",
    ),
}


def _format_error(path: Path, err: dict[str, Any], model: type[BaseModel]) -> str:
    loc = [str(p) for p in err.get("loc", ())]
    where = ".".join(loc) or "(top level)"
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        parent = _model_at(model, loc[:-1])
        allowed = ", ".join(parent.model_fields) if parent else "?"
        return f"{path}: {where}: unknown key; allowed keys here: {allowed}"
    if kind == "missing":
        return f"{path}: {where}: required field is missing"
    msg = err.get("msg", "invalid")
    if kind.startswith("value_error"):
        msg = msg.removeprefix("Value error, ")
    return f"{path}: {where}: {msg}"


def _model_at(model: type[BaseModel], loc: list[str]) -> type[BaseModel] | None:
    current: type[BaseModel] = model
    for part in loc:
        field = current.model_fields.get(part)
        if field is None:
            return None
        nested = [a for a in _model_args(field.annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
        if not nested:
            return None
        current = nested[0]
    return current


def _model_args(annotation: Any) -> list[Any]:
    args = getattr(annotation, "__args__", None)
    if not args:
        return [annotation]
    out: list[Any] = []
    for a in args:
        out.extend(_model_args(a))
    return out


def parse_spec(raw: Any, *, path: Path, default_name: str) -> DatasetSpec:
    """Validate a parsed YAML document; errors name the file, the key and what is allowed."""
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: the spec must be a mapping of keys (got {type(raw).__name__})")
    raw = dict(raw)
    if raw.setdefault("name", default_name) != default_name:
        raise SpecError(f"{path}: name: {raw['name']!r} must equal the file name {default_name!r}")
    try:
        return DatasetSpec.model_validate(raw)
    except ValidationError as exc:
        lines = [_format_error(path, e, DatasetSpec) for e in exc.errors()]
        raise SpecError("\n".join(lines)) from None


def _inside(path: Path, root: Path) -> bool:
    return path.resolve().is_relative_to(root.resolve())


def path_errors(spec: DatasetSpec, data_dir: Path) -> list[str]:
    """What is wrong with the files a spec names: a relative path must stay inside the data dir (absolute
    paths are the user's explicit choice) and must exist, so a typo surfaces when the spec loads."""
    tok = spec.tokenizer
    named: list[tuple[str, str, str]] = []  # (key, value, what it must be)
    if tok.path is not None:
        named.append(("tokenizer.path", tok.path, "dir"))
    if tok.chat_template_file is not None:
        named.append(("tokenizer.chat_template_file", tok.chat_template_file, "file"))
    if tok.train is not None:
        named += [("tokenizer.train.files", pattern, "glob") for pattern in tok.train.files]
    errors: list[str] = []
    for key, value, kind in named:
        path = Path(value)
        if not path.is_absolute():
            if not _inside(data_dir / path, data_dir):
                errors.append(
                    f"{key}: {value!r} leaves the data dir {data_dir} (a relative path must stay inside "
                    "it; give an absolute path to use files elsewhere)"
                )
                continue
            path = data_dir / path
        if kind == "dir" and not path.is_dir():
            errors.append(f"{key}: {value!r} is not a directory (resolved to {path})")
        elif kind == "file" and not path.is_file():
            errors.append(f"{key}: {value!r} is not a file (resolved to {path})")
        elif kind == "glob" and not any(Path(m).is_file() for m in glob.glob(str(path), recursive=True)):
            errors.append(f"{key}: {value!r} matches no file (resolved to {path})")
    return errors


def load_spec(path: Path, data_dir: Path | None = None) -> DatasetSpec:
    """Load and validate `<data dir>/datasets/<name>.yaml`, and check the paths it names."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: not valid YAML: {exc}") from None
    spec = parse_spec(raw, path=path, default_name=path.stem)
    errors = path_errors(spec, data_dir if data_dir is not None else path.resolve().parent.parent)
    if errors:
        raise SpecError("\n".join(f"{path}: {e}" for e in errors))
    return spec


@dataclass(frozen=True)
class SpecScan:
    """The specs of a data dir: the valid ones, and each broken one's error by dataset name (its file stem)."""

    specs: list[DatasetSpec]
    broken: dict[str, str]

    def only(self, name: str) -> SpecScan:
        return SpecScan([s for s in self.specs if s.name == name], {k: v for k, v in self.broken.items() if k == name})


def scan_specs(datasets_dir: Path) -> SpecScan:
    """Every spec file under a `datasets/` folder: one broken file never hides the others."""
    specs: list[DatasetSpec] = []
    broken: dict[str, str] = {}
    for path in sorted(datasets_dir.glob("*.yaml")) + sorted(datasets_dir.glob("*.yml")):
        try:
            specs.append(load_spec(path, datasets_dir.parent))
        except SpecError as exc:
            broken[path.stem] = str(exc)
    return SpecScan(sorted(specs, key=lambda s: s.name), broken)


def load_specs(datasets_dir: Path) -> list[DatasetSpec]:
    """All specs under a `datasets/` folder, sorted by name; every invalid file is reported at once."""
    scan = scan_specs(datasets_dir)
    if scan.broken:
        raise SpecError("\n".join(scan.broken.values()))
    return scan.specs
