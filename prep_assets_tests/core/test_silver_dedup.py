"""Silver's exact and near dedup and quality filters on records built here (and a labelled real set)."""

import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import yaml

from prep_assets.core.clean import heuristic_verdict, repeated_ngram_fraction
from prep_assets.core.lake import dataset_paths, read_json
from prep_assets.core.manifest import build_manifest
from prep_assets.core.retire import retire_drop
from prep_assets.core.silver import repeats_in, repeats_of_earlier_drops
from prep_assets.core.spec import load_spec, parse_spec
from prep_assets.core.spec_sections import QualitySpec
from prep_assets_tests.conftest import PROJECT, copy_sample_data, make_spec, shared_path
from prep_assets_tests.core.helpers import random_doc, run_core, silver_of, write_raw


def test_crlf_and_lf_versions_dedup_together(tmp_path: Path):
    kept, rejects, _ = silver_of(tmp_path, [{"text": "line one\r\nline two"}, {"text": "line one\nline two"}])
    assert len(kept) == 1 and rejects[0]["reason"] == "duplicate" and rejects[0]["duplicate_of"].endswith(":1")


def test_two_chats_sharing_a_500_char_system_prompt_are_both_kept_exact_and_near(tmp_path: Path):
    system = ("You are a careful assistant for a weather service. " * 12)[:500]
    chats = [
        {
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": q},
                {"role": "assistant", "content": a},
            ]
        }
        for q, a in (("What is 2 + 2?", "4."), ("Name a cold front's sign.", "A sudden drop in temperature."))
    ]
    for dedup in ("exact", "near"):
        kept, rejects, _ = silver_of(tmp_path / dedup, chats, dedup=dedup)
        assert len(kept) == 2 and rejects == [], dedup


def test_near_copies_are_removed_naming_the_earliest_kept_record(tmp_path: Path):
    rng = random.Random(3)
    a, b = random_doc(rng), random_doc(rng)
    words = a.split()
    words[10], words[60] = "changed", "words"
    rows = [{"text": a}, {"text": b}, {"text": " ".join(words)}, {"text": a + " Subscribe for more."}, {"text": a}]
    kept, rejects, stats = silver_of(tmp_path, rows, dedup="near")
    assert [json.loads(r["content"])["text"] for r in kept] == [a, b]
    by_line = {r["source_line"]: (r["reason"], r["duplicate_of"].rsplit(":", 1)[1]) for r in rejects}
    assert by_line == {3: ("near_duplicate", "1"), 4: ("near_duplicate", "1"), 5: ("duplicate", "1")}
    assert stats.rejects_by_reason == {"duplicate": 1, "near_duplicate": 2}


def test_an_exact_copy_of_a_near_duplicate_names_the_kept_record(tmp_path: Path):
    rng = random.Random(4)
    a = random_doc(rng)
    near = a.replace(a.split()[5], "edited", 1)
    _, rejects, _ = silver_of(tmp_path, [{"text": a}, {"text": near}, {"text": near}], dedup="near")
    assert [(r["reason"], r["duplicate_of"].rsplit(":", 1)[1]) for r in rejects] == [
        ("near_duplicate", "1"),
        ("near_duplicate", "1"),
    ]


def test_near_dedup_keeps_distinct_documents(tmp_path: Path):
    rng = random.Random(5)
    rows = [{"text": random_doc(rng)} for _ in range(200)]
    kept, rejects, _ = silver_of(tmp_path, rows, dedup="near")
    assert len(kept) == 200 and rejects == []


def test_quality_filters_each_reject_with_their_reason(tmp_path: Path):
    rng = random.Random(6)
    good = random_doc(rng, 60)
    rows = [
        {"text": good},
        {"text": "too few words here"},
        {"text": "\n".join(["same line again"] * 5 + [good])},
        {"text": " ".join(["the same five words here"] * 20)},
        {"text": "#### $$$$ %%%% " * 40 + good},
    ]
    quality = {
        "min_words": 20,
        "max_repeated_line_fraction": 0.3,
        "max_repeated_ngram_fraction": 0.5,
        "max_non_alnum_fraction": 0.2,
    }
    kept, rejects, stats = silver_of(tmp_path, rows, quality=quality)
    assert len(kept) == 1
    assert {r["source_line"]: r["reason"] for r in rejects} == {
        2: "too_few_words",
        3: "repeated_lines",
        4: "repeated_ngrams",
        5: "non_alphanumeric",
    }
    assert all(r["content"] for r in rejects)  # the normalized content each filter saw


def test_quality_heuristics_off_by_default_and_measured_exactly():
    assert heuristic_verdict("x", QualitySpec()) is None
    words = "a b c a b c d".split()
    assert repeated_ngram_fraction(words, 3) == 6 / 7  # 'a b c' twice covers six of seven one-char words
    assert repeated_ngram_fraction(words, 4) == 0.0


def test_shuffled_lines_keep_the_same_contents(tmp_path: Path):
    rng = random.Random(7)
    docs = [random_doc(rng, 40) for _ in range(30)]
    rows = [{"text": d} for d in docs + docs[:10]]
    shuffled = rows[:]
    random.Random(1).shuffle(shuffled)
    a, _, _ = silver_of(tmp_path / "a", rows)
    b, _, _ = silver_of(tmp_path / "b", shuffled)
    assert sorted(r["content"] for r in a) == sorted(r["content"] for r in b) and len(a) == 30


_RUN = """
import json, random, sys
from pathlib import Path
from prep_assets_tests.core.helpers import random_doc, silver_of
rng = random.Random(8)
docs = [random_doc(rng, 50) for _ in range(40)]
rows = [{"text": d} for d in docs] + [{"text": docs[3] + " extra tail"}, {"text": docs[5]}]
silver_of(Path(sys.argv[1]), rows, dedup="near")
"""


def test_silver_bytes_do_not_depend_on_the_python_hash_seed(tmp_path: Path):
    digests = []
    for seed in ("0", "1", "random"):
        out = tmp_path / seed
        env = {**os.environ, "PYTHONHASHSEED": seed}
        subprocess.run([sys.executable, "-c", _RUN, str(out)], check=True, env=env, cwd=PROJECT)
        files = sorted((out / "lake" / "ds" / "silver").rglob("*.*"))
        digests.append({f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in files})
    assert len(digests[0]) == 4 and digests[0] == digests[1] == digests[2]


def test_near_dedup_precision_and_recall_on_labelled_c4(tmp_path: Path):
    from prep_assets.near_eval import evaluate_near

    result = evaluate_near(shared_path("datasets/text/c4_demo.jsonl"), work=tmp_path)
    print(f"near dedup on c4_demo: {result}, precision {result.precision:.3f}, recall {result.recall:.3f}")
    assert result.copies >= 100 and result.precision >= 0.95 and result.recall >= 0.95


def test_indic_text_counts_its_vowel_signs_as_letters():
    hindi = "भारत एक विशाल देश है और इसकी संस्कृति बहुत पुरानी है"
    q = QualitySpec(max_non_alnum_fraction=0.25, min_words=10)
    assert heuristic_verdict(hindi, q) is None  # `\w` alone split words at vowel signs and counted them as symbols


def test_texts_without_words_are_compared_by_characters(tmp_path: Path):
    rows = [{"text": "→ ← ↑ ↓ ∀ ∃ ∈"}, {"text": "🙂🙂🙂 ❤️ ★★★"}]
    kept, rejects, _ = silver_of(tmp_path, rows, dedup="near")
    assert len(kept) == 2 and rejects == []


def test_near_dedup_is_refused_for_tables():
    import pytest

    from prep_assets.core.errors import SpecError

    with pytest.raises(SpecError, match="dedup: near compares text"):
        make_spec("t", input={"type": "tabular"}, clean={"dedup": "near"})


def test_manifest_counts_repeats_of_earlier_drops_under_drop_scope_among_its_own_drops_only(tmp_path: Path):
    """`dedup_scope: drop` keeps a later drop's copies of earlier drops' records; the manifest says how many, per
    drop, counted against the earlier drops it holds (so the figure follows the manifest, not the build order)."""
    notes = [f"Field note {i}: the gauge at station {i % 7} read {i * 3} centimetres today." for i in range(40)]
    drops = {"a_2026-11-01.jsonl": notes[:20], "b_2026-11-02.jsonl": notes[10:30], "c_2026-11-03.jsonl": notes[5:8]}
    data = copy_sample_data(tmp_path / "data")
    raw = yaml.safe_load((data / "datasets" / "sample_text.yaml").read_text(encoding="utf-8"))
    raw["clean"]["dedup_scope"] = "drop"
    raw["output"] = {"formats": ["parquet"]}
    (data / "datasets" / "notes.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    write_raw(data, "notes", {n: "".join(json.dumps({"text": t}) + "\n" for t in ts) for n, ts in drops.items()})
    spec, paths = load_spec(data / "datasets" / "notes.yaml"), dataset_paths(data, "notes")
    keys = list(run_core(data, spec))
    manifest = read_json(paths.manifest_path)
    assert [manifest["partitions"][k]["repeats_of_earlier_drops"] for k in keys] == [0, 10, 3]
    without_a = build_manifest(spec, paths, keys[1:])
    assert [without_a["partitions"][k]["repeats_of_earlier_drops"] for k in keys[1:]] == [0, 0]
    # one pass over the drops gives each drop's figure against the earlier drops of `among` (default: all)
    assert repeats_in(spec, paths, keys) == dict(zip(keys, [0, 10, 3], strict=True))
    assert repeats_in(spec, paths, keys, among=keys[1:]) == dict(zip(keys, [0, 0, 0], strict=True))
    assert repeats_in(spec, paths, keys[1:], among=[keys[0], keys[2]]) == {keys[1]: 10, keys[2]: 3}
    assert repeats_in(spec, paths, [keys[2]], among=[keys[1], keys[2]]) == {keys[2]: 0}
    assert [repeats_of_earlier_drops(spec, paths, k) for k in keys] == [0, 10, 3]
    raw["clean"]["dedup_scope"] = "dataset"  # removes them: nothing to report
    dataset_scope = parse_spec(raw, path=Path("notes.yaml"), default_name="notes")
    assert repeats_of_earlier_drops(dataset_scope, paths, keys[1], among=keys) is None
    assert repeats_in(dataset_scope, paths, keys) is None
    # a drop being retired (registration gone, still one of Dagster's partitions) is no earlier drop, and no error
    retire_drop(paths, keys[0])
    after = build_manifest(spec, paths, keys)
    assert sorted(after["partitions"]) == keys[1:]
    assert [after["partitions"][k]["repeats_of_earlier_drops"] for k in keys[1:]] == [0, 0]
