import random
import re
import unicodedata
from collections import Counter

import pyarrow as pa

from prep_assets.core.clean import (
    FILTERS,
    SPACES_ABOVE_ASCII,
    active_filters,
    assign_split,
    content_sha256,
    left_as_is,
    nfc_stable,
    normalization_screen,
    normalize_content,
    normalize_text,
    quality_verdict,
    trained_roles,
)
from prep_assets.core.lake import canonical_json
from prep_assets.core.spec_sections import NormalizeSpec, SplitSpec
from prep_assets_tests.conftest import make_spec

NORM = NormalizeSpec()


def test_nfc_and_nfd_forms_hash_the_same_after_normalization():
    nfd = unicodedata.normalize("NFD", "café crème")
    a = normalize_content({"text": "café crème"}, NORM)
    b = normalize_content({"text": nfd}, NORM)
    assert content_sha256(a) == content_sha256(b)


def test_crlf_and_lone_cr_become_newlines():
    assert normalize_text("a\r\nb\rc", NORM) == "a\nb\nc"


def test_control_chars_stripped_but_tab_and_newline_kept():
    assert normalize_text("a\x00b\tc\nd\x07e\x7f", NORM) == "ab\tc\nde"


def test_trailing_whitespace_per_line_and_at_end():
    assert normalize_text("a  \nb\t\n\n  ", NORM) == "a\nb"


def test_normalization_switched_off_keeps_bytes():
    off = NormalizeSpec(nfc=False, newlines=False, control_chars=False, trailing_whitespace=False)
    assert normalize_text("a\r\n\x00 ", off) == "a\r\n\x00 "


def _as_is(contents: list[dict]) -> list[bool]:
    return left_as_is(pa.array([canonical_json(c) for c in contents])).tolist()


def test_left_as_is_passes_clean_ascii_and_flags_everything_normalization_would_touch():
    clean = [
        {"text": "plain words, 'quotes' and \"escapes\" and a\ttab\nand lines"},
        {"turns": [{"prompt": "What is 2+2?", "completion": "4."}]},
        {"text": ""},
    ]
    touched = [
        "caf\u00e9",
        "a\r\nb",
        "a\rb",
        "a\x00b",
        "a\x07b",
        "a\x08b",
        "a\x0cb",
        "a\x7fb",
        "a \nb",
        "a\t\nb",
        "ends with space ",
        "ends with newline\n",
        "ends with tab\t",
        "a\x1fb",
    ]
    assert _as_is(clean) == [True] * len(clean)
    assert _as_is([{"text": t} for t in touched]) == [False] * len(touched)
    assert _as_is([{"turns": [{"prompt": "fine", "completion": t}]} for t in touched]) == [False] * len(touched)
    assert left_as_is(pa.array([], pa.string())).tolist() == []


def _every_step_and_each_alone() -> list[NormalizeSpec]:
    """The default normalization (every step on), then each step on alone."""
    steps = ("nfc", "newlines", "control_chars", "trailing_whitespace")
    return [NORM] + [NormalizeSpec(**{k: k == on for k in steps}) for on in steps]


def test_left_as_is_never_passes_a_record_that_normalization_changes():
    """Random texts over the characters each step acts on: wherever `left_as_is` says so, normalizing (every
    step on, and each one alone) leaves the canonical JSON exactly as it was."""
    rng = random.Random(7)
    alphabet = list("ab \t\n\r\\\"'u0") + [
        "\x00",
        "\x08",
        "\x0b",
        "\x0c",
        "\x1c",
        "\x7f",
        "\x85",
        "\xa0",
        "e\u0301",
        "\u00e9",
        "\u2028",
        "\u3000",
        "\\u00",
        "\\n",
        "\\r",
    ]
    contents = [{"text": "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8)))} for _ in range(20_000)]
    contents += [{"turns": [{"prompt": c["text"], "completion": "x"}]} for c in contents[:2000]]
    flags = _as_is(contents)
    assert 1000 < sum(flags) < len(flags)  # both paths are exercised
    specs = _every_step_and_each_alone()
    for content, same in zip(contents, flags):
        if same:
            for norm in specs:
                assert canonical_json(normalize_content(content, norm)) == canonical_json(content), content


def test_the_screen_names_every_whitespace_character_above_ascii():
    spaces = re.compile(f"[{SPACES_ABOVE_ASCII}]")
    above_ascii = [chr(c) for c in range(0x80, 0x110000)]
    assert [c for c in above_ascii if c.isspace()] == [c for c in above_ascii if spaces.fullmatch(c)]


def test_a_record_left_to_nfc_is_unchanged_by_normalization_wherever_its_texts_are_nfc():
    """Random texts beyond ASCII over the characters each step acts on: wherever `normalization_screen` leaves a
    record to NFC and `nfc_stable` passes it (every step on, and each one alone), normalizing leaves the canonical
    JSON exactly as it was; ASCII records are never left to NFC, and the first answer is `left_as_is`'s."""
    rng = random.Random(11)
    alphabet = list("ab \t\n\r\\\"'u0") + [
        "\x00",
        "\x0b",
        "\x1c",
        "\x7f",
        "\x80",
        "\x85",
        "\x9f",
        "\xa0",
        "\xe9",
        "e\u0301",
        "\u0301",
        "\u1680",
        "\u2007",
        "\u2028",
        "\u2029",
        "\u202f",
        "\u3000",
        "\u212b",  # Angstrom sign: NFC makes it \xc5
        "\uac00",
        "\U0001f600",
        "\\u00",
        "\\n",
    ]
    contents = [{"text": "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8)))} for _ in range(20_000)]
    contents += [{"turns": [{"prompt": c["text"], "completion": "\xe9" + c["text"]}]} for c in contents[:3000]]
    contents += [{"messages": [{"role": "user", "content": c["text"]}]} for c in contents[3000:5000]]
    canonical = pa.array([canonical_json(c) for c in contents])
    as_is, nfc_only = normalization_screen(canonical)
    assert as_is.tolist() == left_as_is(canonical).tolist() and not (as_is & nfc_only).any()
    specs = _every_step_and_each_alone()
    passed = 0
    for content, to_nfc in zip(contents, nfc_only.tolist()):
        assert not to_nfc or not canonical_json(content).isascii()
        for norm in specs:
            if to_nfc and nfc_stable(content, norm):
                passed += 1
                assert canonical_json(normalize_content(content, norm)) == canonical_json(content), content
    assert 1000 < passed
    assert nfc_stable({"text": "\u212b"}, NORM) is False and nfc_stable({"text": "\u212b"}, specs[2]) is True
    assert nfc_stable({"columns": ["a"], "values": ["\xe9"]}, NORM) is False  # tables: the record-by-record path


def test_prompt_keeps_its_trailing_whitespace_so_it_is_never_glued_to_the_completion():
    for prompt, completion in (("Q: 2+2=\n", "4"), ("...or maybe? ", "Yes"), ("a  \nb \t", " c  \n")):
        out = normalize_content({"turns": [{"prompt": prompt, "completion": completion}]}, NORM)["turns"][0]
        assert out["prompt"] == normalize_text(prompt, NORM, strip_end=False)
        assert out["prompt"][-1:].isspace() and out["prompt"].rstrip() == normalize_text(prompt, NORM).rstrip()
        assert out["completion"] == normalize_text(completion, NORM)  # its end is followed by the EOS only
    assert normalize_text("a  \nb \t", NORM, strip_end=False) == "a\nb \t"  # inside the field: per line


def test_messages_and_documents_still_lose_their_trailing_whitespace():
    chat = normalize_content({"messages": [{"role": "user", "content": "hi \n"}]}, NORM)
    assert chat["messages"][0]["content"] == "hi"
    assert normalize_content({"text": "doc \n\n"}, NORM) == {"text": "doc"}


def test_whitespace_only_trained_turns_are_rejected_unless_the_spec_keeps_them():
    chat = make_spec(input={"type": "chat"})
    keep = make_spec(input={"type": "chat"}, clean={"keep_empty_turns": True})
    trained = trained_roles(chat)
    assert trained == {"assistant"}
    msgs = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": " \n\t"}]}
    verdict = quality_verdict(msgs, chat.clean, trained=trained)
    assert verdict is not None and verdict.reason == "empty_completion" and "messages[1] (assistant)" in verdict.detail
    assert quality_verdict(msgs, keep.clean, trained=trained) is None
    masked_empty = {"messages": [{"role": "user", "content": " "}, {"role": "assistant", "content": "ok"}]}
    assert quality_verdict(masked_empty, chat.clean, trained=trained) is None  # an empty masked turn trains nothing
    turns = {"turns": [{"prompt": "q", "completion": "  "}]}
    assert quality_verdict(turns, make_spec().clean).reason == "empty_completion"  # type: ignore[union-attr]
    pref = {
        "prompt": [],
        "chosen": [{"role": "assistant", "content": "\n"}],
        "rejected": [{"role": "assistant", "content": "no"}],
    }
    assert quality_verdict(pref, chat.clean, trained=trained).reason == "empty_completion"  # type: ignore[union-attr]


def test_active_filters_judge_every_record_as_all_filters_do_whatever_the_spec_switches_off():
    records = [
        {"text": ""},
        {"text": "abc"},
        {"text": "one two two two two two two two two"},
        {"turns": [{"prompt": "q", "completion": " "}]},
        {"turns": [{"prompt": "q", "completion": "a fine answer"}]},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "\t"}]},
        {
            "prompt": [],
            "chosen": [{"role": "assistant", "content": "same"}],
            "rejected": [{"role": "assistant", "content": "same"}],
        },
    ]
    quality = {"min_words": 3, "max_repeated_ngram_fraction": 0.2, "repeated_ngram_size": 2}
    for clean in (
        {},
        {"keep_empty_turns": True},
        {"quality": quality},
        {"quality": quality, "keep_empty_turns": True},
    ):
        spec = make_spec(input={"type": "chat"}, clean={"min_chars": 3, **clean})
        active, trained = active_filters(spec.clean), trained_roles(spec)
        assert len(active) == len(FILTERS) - ("quality" not in clean) - ("keep_empty_turns" in clean)
        for content in records:
            assert quality_verdict(content, spec.clean, trained=trained, filters=active) == quality_verdict(
                content, spec.clean, trained=trained
            ), (clean, content)


def test_quality_verdicts_name_their_reason():
    spec = make_spec(clean={"min_chars": 5, "max_chars": 10})
    assert quality_verdict({"text": ""}, spec.clean).reason == "empty"  # type: ignore[union-attr]
    assert quality_verdict({"text": "abc"}, spec.clean).reason == "too_short"  # type: ignore[union-attr]
    assert quality_verdict({"text": "x" * 11}, spec.clean).reason == "too_long"  # type: ignore[union-attr]
    assert quality_verdict({"text": "abcdef"}, spec.clean) is None
    turns = {"turns": [{"prompt": "question", "completion": ""}]}
    assert quality_verdict(turns, spec.clean).reason == "empty_completion"  # type: ignore[union-attr]


def test_quality_verdict_given_the_texts_equals_computing_them_and_heuristics_run_only_when_on():
    from prep_assets.core.records import content_texts

    off = make_spec(clean={"min_chars": 1}).clean
    on = make_spec(clean={"min_chars": 1, "quality": {"max_repeated_line_fraction": 0.3}}).clean
    assert not off.quality.enabled and on.quality.enabled
    for heuristic in (
        "min_words",
        "max_repeated_line_fraction",
        "max_repeated_ngram_fraction",
        "max_non_alnum_fraction",
    ):
        assert make_spec(clean={"quality": {heuristic: 1}}).clean.quality.enabled, heuristic
    assert not make_spec(clean={"quality": {"repeated_ngram_size": 3}}).clean.quality.enabled
    repeated = {"turns": [{"prompt": "same\nsame\nsame", "completion": "same\nsame"}]}
    for content in (repeated, {"text": ""}, {"text": "abc"}, {"turns": [{"prompt": "q", "completion": ""}]}):
        for clean in (off, on):
            assert quality_verdict(content, clean, content_texts(content)) == quality_verdict(content, clean)
    assert quality_verdict(repeated, off) is None
    assert quality_verdict(repeated, on).reason == "repeated_lines"  # type: ignore[union-attr]


def test_content_hash_covers_every_field_not_a_prefix():
    shared = "s" * 500
    a = {"turns": [{"prompt": shared, "completion": "one"}]}
    b = {"turns": [{"prompt": shared, "completion": "two"}]}
    assert content_sha256(a) != content_sha256(b)


def test_split_is_deterministic_and_near_the_ratio():
    split = SplitSpec(validation_ratio=0.1, test_ratio=0.05, seed=3)
    keys = [f"key-{i}" for i in range(20000)]
    first = [assign_split(k, split) for k in keys]
    assert first == [assign_split(k, split) for k in keys]
    counts = Counter(first)
    assert abs(counts["validation"] / 20000 - 0.1) < 0.01
    assert abs(counts["test"] / 20000 - 0.05) < 0.01
    other_seed = [assign_split(k, SplitSpec(validation_ratio=0.1, test_ratio=0.05, seed=4)) for k in keys]
    assert other_seed != first
