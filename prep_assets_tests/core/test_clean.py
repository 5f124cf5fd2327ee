import unicodedata
from collections import Counter

from prep_assets.core.clean import assign_split, content_sha256, normalize_content, normalize_text, quality_verdict
from prep_assets.core.spec import NormalizeSpec, SplitSpec
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


def test_quality_verdicts_name_their_reason():
    spec = make_spec(clean={"min_chars": 5, "max_chars": 10})
    assert quality_verdict({"text": ""}, spec.clean).reason == "empty"  # type: ignore[union-attr]
    assert quality_verdict({"text": "abc"}, spec.clean).reason == "too_short"  # type: ignore[union-attr]
    assert quality_verdict({"text": "x" * 11}, spec.clean).reason == "too_long"  # type: ignore[union-attr]
    assert quality_verdict({"text": "abcdef"}, spec.clean) is None
    turns = {"turns": [{"prompt": "question", "completion": ""}]}
    assert quality_verdict(turns, spec.clean).reason == "empty_completion"  # type: ignore[union-attr]


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
