"""Dataset specs: one YAML (or JSON) file per dataset, validated on load; an AstrAI pipeline config in JSON is
translated first (core/spec_astrai.py).

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
from typing import Any, get_origin

import yaml
from pydantic import BaseModel, ValidationError, model_validator

from prep_assets.core.errors import SpecError
from prep_assets.core.readers import checked_decoder, duplicate_key_detail
from prep_assets.core.record_types import TYPES, record_type
from prep_assets.core.spec_astrai import AstraiConfig, is_astrai, spec_from_astrai
from prep_assets.core.spec_sections import (
    AUTO_MAX_SEQUENCES,
    ChecksSpec,
    CleanSpec,
    InputSpec,
    Layer,
    MaskAction,
    OutputSpec,
    PackingSpec,
    Recipe,
    SequenceSpec,
    SplitSpec,
    TabularSpec,
    TokenizerSpec,
    _Strict,
)

# What a recipe sets, per section, where the spec leaves a key unset (a key the spec gives wins).
RECIPES: dict[str, dict[str, dict[str, Any]]] = {
    "gdp": {
        # gdp separates prompt and completion by one space, and tokenizes a .txt line with its newline
        "input": {"space_separator": True, "keep_line_ends": True},
        "clean": {"normalize": False, "dedup": "none"},  # gdp tokenizes the text as it is, duplicates included
        "sequence": {"max_seq_len": 2048, "keep_prompt_only_sequences": False},  # gdp drops prompt-only rows
        # gdp's default `full`; rows in input order; under greedy, an example dropped as too long closes the row
        "packing": {"strategy": "full", "shuffle": False, "close_row_at_dropped": True},
    },
    "safe_synthesizer": {  # docs/spec.md, "Safe Synthesizer recipe"
        "tabular": {
            "prompt": "safe_synthesizer",
            "record_encoding": "standalone",
            "float_digits": 10,  # pandas' to_json double_precision
            "key_columns_first": True,
            "assembly": "safe_synthesizer",
            "missing_ints_as_floats": True,  # pandas reads an int column with a missing cell as floats
        },
        "sequence": {"max_seq_len": 2048},  # TinyLlama's context
    },
}

DATASET_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


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
    recipe: Recipe | None = None  # a seed system's defaults for every key the spec leaves unset (RECIPES)

    @model_validator(mode="before")
    @classmethod
    def _recipe_defaults(cls, raw: Any) -> Any:
        """`recipe: gdp`: gdp's behaviour for every key the spec does not set (docs/spec.md, "gdp recipe")."""
        if not isinstance(raw, dict) or raw.get("recipe") not in RECIPES:
            return raw
        raw = dict(raw)
        for section, defaults in RECIPES[raw["recipe"]].items():
            current = raw.get(section) or {}
            if isinstance(current, dict):
                raw[section] = {**defaults, **current}
        return raw

    @model_validator(mode="before")
    @classmethod
    def _prompt_only_keeps_empty_turns(cls, raw: Any) -> Any:
        """gdp's --keep_prompt_only_sequences also keeps a pair whose completion is empty (its prompt alone):
        `clean.keep_empty_turns` follows `sequence.keep_prompt_only_sequences` unless the spec sets it."""
        if not isinstance(raw, dict) or not isinstance(raw.get("sequence"), dict):
            return raw
        if raw["sequence"].get("keep_prompt_only_sequences") is not True:
            return raw
        clean = raw.get("clean") or {}
        if isinstance(clean, dict) and "keep_empty_turns" not in clean:
            raw = {**raw, "clean": {**clean, "keep_empty_turns": True}}
        return raw

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
        if self.input.type not in TYPES:
            raise ValueError(f"input.type {self.input.type!r}: unknown; registered types: {sorted(TYPES)}")
        kind = record_type(self.input.type)
        if self.input.format == "txt" and not (kind.one_per_line or kind.table_rows):  # tables say it themselves
            raise ValueError(f"input.format txt holds one text per line; it cannot carry {self.input.type} records")
        allowed = self.mask_keys
        unknown = sorted(set(self.mask) - set(allowed))
        if unknown:
            raise ValueError(f"mask: unknown key(s) {unknown} for type {self.input.type}; allowed: {list(allowed)}")
        per_row = self.max_per_example
        if kind.paired and per_row is not None and per_row < 2:
            raise ValueError(
                "packing.max_sequences_per_example must be at least 2 for preference data: "
                "both examples of a pair share a row"
            )
        if kind.paired and (self.packing.strategy == "full" or self.sequence.overflow == "window"):
            raise ValueError(
                "preference pairs stay whole in one row: packing.strategy full and sequence.overflow "
                "window would split them; use bfd, ffd or single with drop or truncate_*"
            )
        if self.packing.strategy == "full" and self.sequence.overlap:
            raise ValueError(
                "sequence.overlap applies to windows (overflow: window with bfd, ffd or single); "
                "packing.strategy full cuts examples across rows without repeating tokens"
            )
        if kind.table_rows and self.input.domain_key is not None:
            raise ValueError(
                "input.domain_key names a domain per record; a tabular example assembles many records, so it has "
                "none: split the table into one dataset per domain instead"
            )
        pair_keys = [k for k in ("packing_boundary", "attention_boundary") if getattr(self.packing, k) != "jsonl"]
        if pair_keys and kind.shape != "turns":
            raise ValueError(
                f"packing.{pair_keys[0]} prompt_completion_pair applies to the pairs of instruction records; "
                f"input.type {self.input.type} has no prompt/completion pairs"
            )
        if self.input.categories is not None and (kind.shape not in ("text", "turns") or self.output.categories):
            raise ValueError(
                "input.categories names gdp's categories of text and instruction records (and replaces "
                "output.categories, which maps domains)"
            )
        if kind.table_rows and self.recipe == "gdp":
            raise ValueError("recipe: gdp prepares text and instruction data; tables have no gdp recipe")
        if not kind.table_rows and self.recipe == "safe_synthesizer":
            raise ValueError("recipe: safe_synthesizer prepares tables (input.type tabular)")
        if self.packing.close_row_at_dropped and kind.shape not in ("text", "turns"):
            raise ValueError(
                "packing.close_row_at_dropped is gdp's greedy, for text and instruction records; "
                f"input.type {self.input.type} packs other units"
            )
        if kind.table_rows:
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
        tab = self.tabular
        if tab is not None and tab.resolved_mode == "sequential" and tab.group_by is None:
            if self.split.holds_out:
                raise ValueError(
                    "an ungrouped time series is one sequence and trains whole (as Safe Synthesizer keeps its "
                    "single group in training): set split.validation_ratio and test_ratio to 0 (and no "
                    "split counts), or give tabular.group_by so that whole groups can be held out"
                )
        if tab is not None and tab.holdout and self.split.holds_out:
            raise ValueError(
                "tabular.holdout is Safe Synthesizer's test split: leave split.validation_ratio, test_ratio and "
                "the split counts at 0 (it draws the held-out records itself, with split.seed)"
            )
        if tab is not None and tab.holdout and tab.resolved_mode == "sequential" and tab.group_by is None:
            raise ValueError(
                "tabular.holdout on an ungrouped time series would take single records out of its one sequence "
                "(as Safe Synthesizer does): give tabular.group_by so that whole groups are held out, or no holdout"
            )
        if tab is not None and tab.group_by is not None and self.split.by_count:
            raise ValueError(
                "split.validation_count / test_count count records, but with tabular.group_by whole groups are "
                "held out: give split.validation_ratio / test_ratio instead"
            )

    @property
    def max_per_example(self) -> int | None:
        """`packing.max_sequences_per_example` resolved: auto = 10; unset = no limit (tabular: auto)."""
        n = self.packing.max_sequences_per_example
        if n == "auto" or (n is None and record_type(self.input.type).table_rows):
            if self.tabular is not None and self.tabular.differential_privacy:
                return 1  # Safe Synthesizer: one unit per example for per-example gradient clipping
            return AUTO_MAX_SEQUENCES
        return n

    @property
    def gold_overflow(self) -> str:
        """The overflow gold applies: `keep` (examples stay whole) where packing splits them (full, window)."""
        if self.packing.strategy == "full" or self.sequence.overflow == "window":
            return "keep"
        return self.sequence.overflow

    @property
    def pair_units(self) -> bool:
        """Whether gold makes an example of each prompt/completion pair (gdp's prompt_completion_pair boundary)."""
        return self.packing.packing_boundary == "prompt_completion_pair"

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
        kind = record_type(self.input.type)
        keys = dict(kind.mask_keys)
        if kind.roles:
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
        for section, key, default in ADDED_KEYS:  # absent at its default: older specs keep their fingerprints
            where = data if section is None else data.get(section)
            if isinstance(where, dict) and where.get(key, default) == default:
                where.pop(key, None)

        def value(k: str) -> Any:
            if "." in k:
                section, key = k.split(".", 1)
                return data[section].get(key, _ABSENT)  # absent: an added key at its default (ADDED_KEYS)
            return data[k] if k in data else getattr(self, k)

        chosen = {k: v for k in (sections or tuple(sorted(data))) if (v := value(k)) is not _ABSENT}
        blob = json.dumps(chosen, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()


_ABSENT = object()

# Keys added after specs were fingerprinted: left out of a fingerprint while at their default, so a spec that does
# not use them keeps its code versions (and its layers stay fresh) across the upgrade.
ADDED_KEYS: tuple[tuple[str | None, str, Any], ...] = (
    ("clean", "max_items", None),
    ("input", "space_separator", False),
    ("input", "keep_line_ends", False),
    ("input", "categories", None),
    ("input", "category_key", "category"),
    ("packing", "packing_boundary", "jsonl"),
    ("packing", "attention_boundary", "jsonl"),
    ("sequence", "keep_prompt_only_sequences", False),
    ("packing", "close_row_at_dropped", False),
    (None, "recipe", None),
    ("tabular", "prompt", "schema"),
    ("tabular", "record_encoding", "continuation"),
    ("tabular", "float_digits", None),
    ("tabular", "key_columns_first", False),
    ("tabular", "assembly", "default"),
    ("tabular", "num_input_records_to_sample", None),
    ("tabular", "differential_privacy", False),
    ("tabular", "timestamp_interval_seconds", None),
    ("tabular", "missing_ints_as_floats", False),
    ("tabular", "validate_time_series", False),
    ("tabular", "timestamp_format", None),
    ("tabular", "holdout", 0.0),
    ("tabular", "max_holdout", 2000),
    ("split", "validation_count", None),
    ("split", "test_count", None),
    ("output", "num_training_splits", None),
    ("output", "num_dev_splits", None),
    ("output", "num_test_splits", None),
)

# Which spec sections shape each layer's output: a change to one makes that layer and those below stale.
# `checks` is in every layer: a changed threshold must re-judge every partition.
# Bump when a layer's code changes what it writes: the UI then shows that layer (and below) stale, and the
# dedup indexes (keyed by silver's version) are rebuilt.
CODE_VERSION = "12"

# the sections every layer from silver down follows (the order of names never changes a fingerprint)
_CLEANED = ("input", "checks", "clean", "split", "tabular")
LAYER_SECTIONS: dict[Layer, tuple[str, ...]] = {
    # tabular: bronze types CSV cells and checks group_by/order_by; silver draws splits by group
    "bronze": ("input", "checks", "tabular"),
    "silver": _CLEANED,
    # gold depends on the overflow it applies (keep under full/window), not on the packing strategy itself;
    # tabular gold assembles examples, so it also follows the packing seed and records per example
    "gold": (
        *_CLEANED,
        "mask",
        "mask_default",
        "tokenizer",
        "sequence.max_seq_len",
        "gold_overflow",
        "tabular_packing",
        "packing.packing_boundary",  # prompt_completion_pair: an example per pair
        "sequence.keep_prompt_only_sequences",  # examples with no trained token kept, not rejected
        "packing.close_row_at_dropped",  # gold marks the examples after a dropped one
    ),
    "shards": (*_CLEANED, "mask", "mask_default", "tokenizer", "sequence", "packing", "output"),
}


class _KeysOnceLoader(yaml.SafeLoader):
    """PyYAML's safe loader, but a mapping that gives a key twice is an error: PyYAML keeps the last value
    without a word, so a spec would not be what its file shows (a merge key `<<` may still be overridden)."""


def _mapping_keys_once(loader: _KeysOnceLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            twice = (type(key), key) in seen  # 1 and true are two keys
        except TypeError:  # not hashable: the mapping's own construction says so
            break
        if twice:
            raise yaml.constructor.ConstructorError(
                "while reading a mapping", node.start_mark, f"key {key!r} is given twice", key_node.start_mark
            )
        seen.add((type(key), key))
    return loader.construct_mapping(node, deep=True)


_KeysOnceLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_keys_once)


def load_document(path: Path) -> Any:
    """A spec file's document: YAML (a safe loader) or, for `.json`, JSON; a key given twice in one mapping is an
    error (`SpecError` naming the file), as every reading of the file must be the one it shows."""
    kind = "JSON" if path.suffix == ".json" else "YAML"
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix != ".json":
            return yaml.load(text, Loader=_KeysOnceLoader)  # a SafeLoader: plain data only
        decoder, repeated = checked_decoder()
        raw = decoder.decode(text)
    except (UnicodeDecodeError, ValueError, RecursionError, yaml.YAMLError) as exc:
        raise SpecError(f"{path}: not valid {kind}: {exc}") from None
    if repeated:
        raise SpecError(f"{path}: not valid JSON: {duplicate_key_detail(repeated)}")
    return raw


def _format_error(path: Path, err: dict[str, Any], model: type[BaseModel]) -> str:
    loc = [str(p) for p in err.get("loc", ())]
    where = ".".join(loc) or "(top level)"
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        parent = _model_at(model, list(err.get("loc", ()))[:-1])  # list indexes as ints
        allowed = ", ".join(parent.model_fields) if parent else "?"
        return f"{path}: {where}: unknown key; allowed keys here: {allowed}"
    if kind == "missing":
        return f"{path}: {where}: required field is missing"
    msg = err.get("msg", "invalid")
    if kind.startswith("value_error"):
        msg = msg.removeprefix("Value error, ")
    return f"{path}: {where}: {msg}"


def _model_at(model: type[BaseModel], loc: list[str | int]) -> type[BaseModel] | None:
    """The model whose keys are allowed at `loc`; a list index or a mapping's key (`phases.0`, `weights.a`) stays
    at the model of the items."""
    current: type[BaseModel] = model
    keyed = False  # the part before named a mapping of models: this part is one of its keys
    members: list[type[BaseModel]] = []  # the models the part before could hold: pydantic may name the one it tried
    for part in loc:
        named = [m for m in members if m.__name__ == part]
        if isinstance(part, int) or keyed or named:
            keyed = False
            current = named[0] if named else current
            continue
        field = current.model_fields.get(part)
        if field is None:
            return None
        members = [a for a in _model_args(field.annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
        if not members:
            return None
        current = members[0]
        keyed = _maps(field.annotation)
    return current


def _maps(annotation: Any) -> bool:
    """Whether a field's type is a mapping (maybe optional): its next location part is a key, not a field."""
    if get_origin(annotation) is dict:
        return True
    return any(get_origin(a) is dict for a in getattr(annotation, "__args__", ()) or ())


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


def _template_errors(key: str, source: str) -> list[str]:
    """A chat template's syntax error, as a spec error: compiled as transformers compiles the templates it renders
    (its sandboxed Jinja environment, with its `{% generation %}` tag), so it surfaces when the spec loads rather
    than as every chat record's reject in gold."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:  # a transformers without it: the template is judged when gold renders, as before
        return []
    try:
        _compile_jinja_template(source)
    except RecursionError:
        return [f"{key}: the template does not parse: it nests too deeply"]
    except Exception as exc:  # Jinja's TemplateSyntaxError (and any other refusal of the template)
        line = getattr(exc, "lineno", None)
        where = f" (its line {line})" if line else ""
        return [f"{key}: the template does not parse: {getattr(exc, 'message', None) or exc}{where}"]
    return []


def path_errors(spec: DatasetSpec, data_dir: Path) -> list[str]:
    """What is wrong with the files a spec names: a relative path must stay inside the data dir (absolute
    paths are the user's explicit choice) and must exist, so a typo surfaces when the spec loads; a chat template
    given (inline or as a file) must parse."""
    tok = spec.tokenizer
    named: list[tuple[str, str, str]] = []  # (key, value, what it must be)
    if tok.path is not None:
        named.append(("tokenizer.path", tok.path, "dir"))
    if tok.chat_template_file is not None:
        named.append(("tokenizer.chat_template_file", tok.chat_template_file, "file"))
    if tok.train is not None:
        named += [("tokenizer.train.files", pattern, "glob") for pattern in tok.train.files]
    errors: list[str] = []
    if tok.chat_template is not None:
        errors += _template_errors("tokenizer.chat_template", tok.chat_template)
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
        elif kind == "file" and key == "tokenizer.chat_template_file":
            try:
                errors += _template_errors(key, path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError) as exc:
                errors.append(f"{key}: {value!r} cannot be read as UTF-8 text ({exc})")
        elif kind == "glob":
            matches = [Path(m) for m in glob.glob(str(path), recursive=True) if Path(m).is_file()]
            outside = [m for m in matches if not Path(value).is_absolute() and not _inside(m, data_dir)]
            if not matches:
                errors.append(f"{key}: {value!r} matches no file (resolved to {path})")
            elif outside:
                errors.append(
                    f"{key}: {value!r} matches {outside[0]}, outside the data dir {data_dir} (through a "
                    "link); give an absolute path to use files elsewhere"
                )
    return errors


def parse_astrai(raw: dict[str, Any], *, path: Path, default_name: str) -> DatasetSpec:
    """Validate an AstrAI pipeline config against its own schema, then as the spec it translates to."""
    try:
        cfg = AstraiConfig.model_validate(raw)
    except ValidationError as exc:
        raise SpecError("\n".join(_format_error(path, e, AstraiConfig) for e in exc.errors())) from None
    return parse_spec(spec_from_astrai(cfg), path=path, default_name=default_name)


def load_spec(path: Path, data_dir: Path | None = None) -> DatasetSpec:
    """Load and validate `<data dir>/datasets/<name>.yaml` (or `.json`: our keys, or an AstrAI pipeline config),
    and check the paths it names."""
    raw = load_document(path)
    if is_astrai(raw):
        spec = parse_astrai(raw, path=path, default_name=path.stem)
    else:
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


SPEC_SUFFIXES = (".yaml", ".yml", ".json")


def scan_specs(datasets_dir: Path) -> SpecScan:
    """Every spec file under a `datasets/` folder: one broken file never hides the others."""
    specs: list[DatasetSpec] = []
    broken: dict[str, str] = {}
    files = [p for ext in SPEC_SUFFIXES for p in sorted(datasets_dir.glob(f"*{ext}"))]
    for path in files:
        twins = [p.name for p in files if p.stem == path.stem]
        if len(twins) > 1:
            broken[path.stem] = f"{datasets_dir}: dataset {path.stem!r} has {len(twins)} spec files {twins}; keep one"
            continue
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
