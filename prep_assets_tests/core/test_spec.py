import re
from pathlib import Path

import pytest

from prep_assets.core.errors import SpecError
from prep_assets.core.spec import LAYER_SECTIONS, load_spec, load_specs, parse_spec
from prep_assets_tests.conftest import SAMPLE_DATA, make_spec

BASE = {"input": {"type": "text"}, "tokenizer": {"path": "tok"}}


def _err(raw: dict) -> str:
    with pytest.raises(SpecError) as info:
        parse_spec(raw, path=Path("data/datasets/web.yaml"), default_name="web")
    return str(info.value)


def test_minimal_spec_gets_documented_defaults():
    spec = make_spec()
    assert spec.sequence.max_seq_len == 2048
    assert spec.packing.strategy == "bfd"
    assert spec.clean.dedup == "exact"
    assert spec.mask_action("text") == "train"


def test_unknown_key_names_file_key_and_allowed_keys():
    msg = _err({**BASE, "input": {"type": "text", "txt_key": "body"}})
    assert "data/datasets/web.yaml" in msg
    assert "input.txt_key: unknown key" in msg
    assert "text_key" in msg and "prompt_key" in msg


def test_unknown_top_level_key_lists_sections():
    msg = _err({**BASE, "packin": {}})
    assert "packin: unknown key" in msg and "packing" in msg


def test_wrong_type_names_key():
    msg = _err({**BASE, "sequence": {"max_seq_len": "long"}})
    assert "sequence.max_seq_len" in msg and "integer" in msg


def test_wrong_literal_lists_allowed_values():
    msg = _err({**BASE, "packing": {"strategy": "magic"}})
    assert "packing.strategy" in msg and "'bfd'" in msg


def test_missing_required_field():
    msg = _err({"input": {"type": "text"}})
    assert "tokenizer: required field is missing" in msg


def test_tokenizer_needs_exactly_one_source():
    assert "exactly one of path, hub_id, train" in _err({**BASE, "tokenizer": {"path": "a", "hub_id": "b"}})
    assert "revision" in _err({**BASE, "tokenizer": {"hub_id": "gpt2"}})


def test_mask_key_unknown_for_type():
    assert "allowed: ['prompt', 'completion']" in _err(
        {**BASE, "input": {"type": "instruction"}, "mask": {"user": "mask"}}
    )


def test_name_must_match_file():
    assert "must equal the file name" in _err({**BASE, "name": "other"})


def test_fingerprint_changes_only_with_named_sections():
    a = make_spec(sequence={"max_seq_len": 512})
    b = make_spec(sequence={"max_seq_len": 1024})
    assert a.fingerprint("input", "clean") == b.fingerprint("input", "clean")
    assert a.fingerprint("sequence") != b.fingerprint("sequence")


def test_invalid_yaml_file_is_reported(tmp_path: Path):
    (tmp_path / "bad.yaml").write_text("input: [unclosed\n", encoding="utf-8")
    with pytest.raises(SpecError, match="bad.yaml: not valid YAML"):
        load_spec(tmp_path / "bad.yaml")


def test_shipped_sample_specs_are_valid():
    names = [s.name for s in load_specs(SAMPLE_DATA / "datasets")]
    assert names == ["sample_chat", "sample_instruct", "sample_pref", "sample_sensors", "sample_text"]


def test_chat_mask_keys_are_roles_including_role_map_targets():
    spec = make_spec(input={"type": "chat", "role_map": {"critic": "reviewer"}}, mask={"reviewer": "train"})
    assert spec.mask_action("assistant") == "train" and spec.mask_action("tool") == "mask"
    assert spec.mask_action("reviewer") == "train" and spec.input.roles["gpt"] == "assistant"
    with pytest.raises(SpecError, match=r"mask: unknown key\(s\) \['prompt'\] for type chat"):
        make_spec(input={"type": "chat"}, mask={"prompt": "train"})


def test_chat_edge_specs_rejected_with_the_reason():
    with pytest.raises(SpecError, match="cannot carry chat records"):
        make_spec(input={"type": "chat", "format": "txt"})
    with pytest.raises(SpecError, match="not both"):
        make_spec(tokenizer={"path": "x", "chat_template": "{{ 1 }}", "chat_template_file": "t.jinja"})


def test_tabular_mode_follows_the_keys_and_sequential_takes_priority():
    tab = {"type": "tabular"}
    assert make_spec(input=tab).tabular.resolved_mode == "flat"
    assert make_spec(input=tab, tabular={"group_by": "g"}).tabular.resolved_mode == "grouped"
    seq = make_spec(input=tab, tabular={"group_by": "g", "order_by": "t", "time_series": True})
    assert seq.tabular.resolved_mode == "sequential" and seq.packing.strategy == "single"
    assert make_spec(input=tab).max_per_example == 10  # unset = auto for tables
    assert make_spec(input=tab, packing={"max_sequences_per_example": "auto"}).max_per_example == 10
    assert make_spec(input={"type": "text"}, packing={"max_sequences_per_example": "auto"}).max_per_example == 10
    assert make_spec(input={"type": "text"}).max_per_example is None


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            {"tabular": {"time_series": True, "group_by": "g"}},
            "sequential mode (time series) needs order_by (a timestamp column), or timestamp_interval_seconds",
        ),
        (
            {"tabular": {"time_series": True, "order_by": "t", "timestamp_interval_seconds": 60}},
            "timestamp_interval_seconds with order_by is checked against the timestamps",
        ),
        (
            {"tabular": {"group_by": "g", "timestamp_interval_seconds": 60}},
            "timestamp_interval_seconds is a time series' interval",
        ),
        ({"tabular": {"group_by": "g", "validate_time_series": True}}, "validate_time_series and timestamp_format"),
        (
            {"tabular": {"time_series": True, "order_by": "t", "timestamp_format": "%Y"}},
            "timestamp_format is read by Safe Synthesizer's validation",
        ),
        (
            {"tabular": {"time_series": True, "order_by": "t"}, "split": {"validation_ratio": 0.1}},
            "an ungrouped time series is one sequence and trains whole",
        ),
        ({"tabular": {"mode": "grouped"}}, "grouped mode needs group_by"),
        ({"tabular": {"mode": "flat", "group_by": "g"}}, "flat mode shuffles single records"),
        ({"tabular": {"mode": "grouped", "group_by": "g", "time_series": True}}, "time_series: true makes the mode"),
        ({"packing": {"strategy": "bfd"}}, "packing.strategy must be single, not bfd"),
        ({"sequence": {"overflow": "truncate_right"}}, "tabular records are never cut"),
        ({"tabular": {"column_types": {"a": "date"}}}, "tabular.column_types.a"),
        ({"packing": {"max_sequences_per_example": 0}}, "max_sequences_per_example must be at least 1"),
    ],
)
def test_tabular_spec_errors_name_the_key(extra: dict, message: str):
    with pytest.raises(SpecError, match=re.escape(message)):
        make_spec(input={"type": "tabular"}, **extra)


def test_tabular_section_only_for_tabular_type():
    with pytest.raises(SpecError, match="tabular: applies to input.type tabular, not text"):
        make_spec(input={"type": "text"}, tabular={})


def test_tabular_settings_make_every_layer_stale_and_tables_default_to_no_dedup():
    base = make_spec(input={"type": "tabular"}, tabular={"group_by": "a"})
    other = make_spec(input={"type": "tabular"}, tabular={"group_by": "b"})
    for layer in ("bronze", "silver", "gold", "shards"):
        assert base.fingerprint(*LAYER_SECTIONS[layer]) != other.fingerprint(*LAYER_SECTIONS[layer])
    assert (
        base.clean.dedup == "none"
        and make_spec(input={"type": "tabular"}, clean={"dedup": "exact"}).clean.dedup == "exact"
    )
    seq = make_spec(input={"type": "tabular"}, tabular={"group_by": "a", "order_by": "t", "time_series": True})
    assert base.shuffles_rows and not seq.shuffles_rows  # sequential examples stay in order in the shards


def test_spec_paths_are_checked_on_load_and_relative_ones_may_not_leave_the_data_dir(tmp_path):
    from prep_assets.core.errors import SpecError
    from prep_assets.core.spec import load_spec, scan_specs

    (tmp_path / "datasets").mkdir()
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "t.jinja").write_text("{{ messages }}")
    (tmp_path / "tok").mkdir()
    cases = {
        "ok": ("tok", "templates/t.jinja", None),
        "escapes": ("tok", "../../etc/passwd", "leaves the data dir"),
        "escapes_via_dot": ("tok", "templates/../../x.jinja", "leaves the data dir"),
        "missing_tok": ("nope", None, "tokenizer.path: 'nope' is not a directory"),
        "missing_template": ("tok", "templates/none.jinja", "is not a file"),
    }
    for name, (tok, template, _) in cases.items():
        line = (
            f"input: {{type: chat}}\ntokenizer: {{path: {tok}"
            + (f", chat_template_file: {template}}}" if template else "}")
            + "\n"
        )
        (tmp_path / "datasets" / f"{name}.yaml").write_text(line)
    scan = scan_specs(tmp_path / "datasets")
    assert [s.name for s in scan.specs] == ["ok"]
    for name, (_, _, error) in cases.items():
        if error is not None:
            assert error in scan.broken[name] and f"{name}.yaml" in scan.broken[name], name
    with pytest.raises(SpecError, match="leaves the data dir"):
        load_spec(tmp_path / "datasets" / "escapes.yaml")
    (tmp_path / "datasets" / "abs.yaml").write_text(
        f"input: {{type: text}}\ntokenizer: {{path: {tmp_path / 'tok'}}}\n"
    )
    assert load_spec(tmp_path / "datasets" / "abs.yaml").tokenizer.path == str(tmp_path / "tok")  # absolute: allowed


def test_a_chat_template_that_does_not_parse_is_a_spec_error_not_every_records_reject(tmp_path):
    """A template with a Jinja syntax error pinned, then rejected every chat record in gold (a drop of 0 examples
    passed with relaxed checks)."""
    from prep_assets.core.spec import scan_specs

    (tmp_path / "datasets").mkdir()
    (tmp_path / "tok").mkdir()
    (tmp_path / "bad.jinja").write_text("{% for m in messages %}{{ m.content }")
    (tmp_path / "good.jinja").write_text(
        "{% for m in messages %}{{ m.content }}{% if loop.last %}{% break %}{% endif %}{% endfor %}"
    )
    specs = {
        "inline": (
            "chat_template",
            '"{% for m in messages %}{{ m.content }"',
            "tokenizer.chat_template: the template",
        ),
        "file": ("chat_template_file", "bad.jinja", "tokenizer.chat_template_file: the template does not parse"),
        "fine": ("chat_template_file", "good.jinja", None),
    }
    # transformers' own tag for the trained span parses; a template nesting too deeply is an error, not a crash
    (tmp_path / "gen.jinja").write_text(
        "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}"
        "{% else %}{{ m.content }}{% endif %}{% endfor %}"
    )
    (tmp_path / "deep.jinja").write_text("{{ " + "(" * 3000 + "1" + ")" * 3000 + " }}")
    specs["generation"] = ("chat_template_file", "gen.jinja", None)
    specs["deep"] = ("chat_template_file", "deep.jinja", "tokenizer.chat_template_file: the template does not parse")
    for name, (key, value, _) in specs.items():
        (tmp_path / "datasets" / f"{name}.yaml").write_text(
            f"input: {{type: chat}}\ntokenizer: {{path: tok, {key}: {value}}}\n"
        )
    scan = scan_specs(tmp_path / "datasets")
    assert sorted(s.name for s in scan.specs) == ["fine", "generation"]
    for name, (_, _, error) in specs.items():
        if error is not None:
            assert error in scan.broken[name], scan.broken[name]
    assert "line 1" in scan.broken["inline"] and "nests too deeply" in scan.broken["deep"]


def test_an_unknown_key_inside_a_union_field_names_the_keys_allowed_there():
    from prep_assets.core.errors import SpecError

    with pytest.raises(SpecError) as err:
        make_spec(clean={"normalize": {"nfcc": True}})
    assert "clean.normalize.NormalizeSpec.nfcc: unknown key; allowed keys here: nfc, newlines" in str(err.value)


def test_a_training_glob_may_not_reach_outside_the_data_dir_through_a_link(tmp_path):
    from prep_assets.core.spec import scan_specs

    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "s.txt").write_text("secret")
    data = tmp_path / "data"
    (data / "datasets").mkdir(parents=True)
    (data / "train").mkdir()
    (data / "train" / "link").symlink_to(tmp_path / "outside")
    for name, pattern in (("star", "train/*/s.txt"), ("globstar", "train/**/*.txt")):
        (data / "datasets" / f"{name}.yaml").write_text(
            f"input: {{type: text}}\ntokenizer: {{train: {{files: ['{pattern}']}}}}\n"
        )
    scan = scan_specs(data / "datasets")
    assert not scan.specs and all("outside the data dir" in scan.broken[n] for n in ("star", "globstar"))


def test_a_key_given_twice_in_a_yaml_or_json_spec_is_an_error_not_the_last_value(tmp_path: Path):
    """PyYAML and json.loads kept the second value: the spec run was not the one the file shows."""
    (tmp_path / "d.yaml").write_text(
        "input: {type: text}\ntokenizer: {path: gpt2}\nclean: {min_chars: 20, min_chars: 900}\n"
    )
    with pytest.raises(SpecError, match=r"(?s)d\.yaml: not valid YAML: .*key 'min_chars' is given twice"):
        load_spec(tmp_path / "d.yaml")
    (tmp_path / "j.json").write_text(
        '{"input": {"type": "text"}, "input": {"type": "chat"}, "tokenizer": {"path": "x"}}'
    )
    with pytest.raises(SpecError, match=r"j\.json: not valid JSON: key 'input' is given twice"):
        load_spec(tmp_path / "j.json")
    (tmp_path / "merge.yaml").write_text(
        "base: &b {type: text}\ninput: {<<: *b, text_key: body}\ntokenizer: {path: gpt2}\n"
    )
    with pytest.raises(SpecError, match="base"):  # a merge key is no key given twice: the spec reads on to its keys
        load_spec(tmp_path / "merge.yaml")
