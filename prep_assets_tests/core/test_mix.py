"""Training mixes in core: specs, the plan against a closed form, the gates, byte-identical reruns."""

from __future__ import annotations

import copy
import json
import math
import shutil
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from prep_assets.core.errors import ReadError, ShardIntegrityError, SpecError
from prep_assets.core.lake import read_json
from prep_assets.core.mix import bucket_seed, load_mix, parse_mix, plan_mix, scan_mixes, write_mix
from prep_assets.core.mix_gates import judge_mix
from prep_assets.core.mix_outputs import MixOutputError
from prep_assets.core.mix_plot import PALETTE, PLANNED, plot_mix
from prep_assets.core.reading import MixRows, PackedRows, order
from prep_assets.core.spec import load_spec
from prep_assets_tests.conftest import copy_sample_data
from prep_assets_tests.core.helpers import gpt_simple_modules, run_core

DATASETS = {"sample_instruct", "sample_text", "sample_chat", "sample_text_b"}


@pytest.fixture(scope="module")
def lake_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample's instruct, text and chat datasets built in core (chat: another tokenizer and max_seq_len), and
    sample_text_b: sample_text's spec and drops again (two buckets never draw on one dataset)."""
    data = copy_sample_data(tmp_path_factory.mktemp("mixdata"))
    shutil.copyfile(data / "datasets" / "sample_text.yaml", data / "datasets" / "sample_text_b.yaml")
    shutil.copytree(data / "raw" / "sample_text", data / "raw" / "sample_text_b")
    for name in sorted(DATASETS):
        run_core(data, load_spec(data / "datasets" / f"{name}.yaml", data))
    return data


def mix(path: str = "m.yaml", **raw: Any):
    doc = {"sources": {"instruct": "sample_instruct", "text": "sample_text"}, **raw}
    return parse_mix(doc, path=Path(path), default_name=Path(path).stem, datasets=DATASETS)


TWO_PHASES = [
    {"name": "warmup", "duration_tokens": 2048, "weights": {"text": 3, "instruct": 1}},
    {"name": "main", "duration_tokens": 4096, "weights": {"text": 1, "instruct": 1}},
]


def failed(outcomes) -> dict[str, str]:
    return {o.name: o.description for o in outcomes if not o.passed}


def test_two_phases_match_the_closed_form(lake_dir: Path) -> None:
    spec = mix(phases=TWO_PHASES, seed=7)
    plan = plan_mix(spec, lake_dir / "lake")
    L = 256
    manifests = {b: read_json(lake_dir / "lake" / d / "manifest.json") for b, d in
                 (("instruct", "sample_instruct"), ("text", "sample_text"))}  # fmt: skip
    start = {"instruct": 0, "text": 0}
    for phase, declared in zip(plan["phases"], TWO_PHASES):
        weights = declared["weights"]
        for b in ("instruct", "text"):
            want = math.ceil(weights[b] / sum(weights.values()) * declared["duration_tokens"] / L)
            got = phase["buckets"][b]
            assert (got["demanded_rows"], got["rows"], got["row_tokens"]) == (want, want, want * L)
            n = manifests[b]["splits"]["train"]["sequences"]
            assert plan["sources"][b]["rows"] == n
            # the rows are the next run of the bucket's seeded stream (epoch 0 here)
            expected = order(n, bucket_seed(7, b), 0)[start[b] : start[b] + want].tolist()
            assert [r for i, r in phase["order"] if i == ["instruct", "text"].index(b)] == expected
            assert got["stream"] == {"start": start[b], "stop": start[b] + want}
            assert sum(stop - s for _, s, stop in got["slices"]) == want
            start[b] += want
        assert len(phase["order"]) == sum(x["rows"] for x in phase["buckets"].values())
    assert {b: plan["buckets"][b]["rows"] for b in start} == start == {"instruct": 2 + 8, "text": 6 + 8}
    assert failed(judge_mix(spec, lake_dir / "lake", plan)) == {}


def test_the_shipped_sample_mix_is_valid(lake_dir: Path) -> None:
    spec = load_mix(Path(__file__).resolve().parents[2] / "data" / "mixes" / "sample_mix.yaml", DATASETS)
    plan = plan_mix(spec, lake_dir / "lake")
    assert failed(judge_mix(spec, lake_dir / "lake", plan)) == {}
    assert [p["name"] for p in plan["phases"]] == ["warmup", "main"]


def test_a_shortfall_fails_the_gate_naming_bucket_demand_inventory_and_remedy(lake_dir: Path) -> None:
    phases = [{"name": "p", "duration_tokens": 40 * 256, "weights": {"text": 1}}]
    spec = mix(phases=phases)
    plan = plan_mix(spec, lake_dir / "lake")
    problems = failed(judge_mix(spec, lake_dir / "lake", plan))
    assert list(problems) == ["training_mix_inventory"]
    message = problems["training_mix_inventory"]
    assert "Mix demands 10.2K (10,240 tokens, 40 rows) from bucket 'text' but only 6.1K available" in message
    assert "(24 rows × 256 tokens × max_epochs 1)" in message and "allow_bucket_exhaustion: true" in message
    assert plan["buckets"]["text"]["rows"] == 24 and plan["buckets"]["text"]["shortfall_rows"] == 16

    allowed = mix(phases=phases, allow_bucket_exhaustion=True)
    outcomes = judge_mix(allowed, lake_dir / "lake", plan_mix(allowed, lake_dir / "lake"))
    assert failed(outcomes) == {}
    (inventory,) = [o for o in outcomes if o.name == "training_mix_inventory"]
    assert "bucket 'text'" in inventory.facts["warnings"][0] and inventory.description.startswith("WARNING")

    upsampled = mix(phases=phases, sources={"text": {"dataset": "sample_text", "max_epochs": 2}})
    plan = plan_mix(upsampled, lake_dir / "lake")
    assert failed(judge_mix(upsampled, lake_dir / "lake", plan)) == {}
    assert plan["buckets"]["text"]["epochs_used"] == 2 and plan["phases"][0]["buckets"]["text"]["epochs"] == [0, 1]


def test_mixed_tokenizers_are_refused_naming_the_sources(lake_dir: Path) -> None:
    spec = parse_mix(
        {"sources": {"instruct": "sample_instruct", "chat": "sample_chat"}, "weights": {"chat": 1, "instruct": 1},
         "duration_tokens": 2048},
        path=Path("m.yaml"), default_name="m", datasets=DATASETS,
    )  # fmt: skip
    problems = failed(judge_mix(spec, lake_dir / "lake", plan_mix(spec, lake_dir / "lake")))
    message = problems["training_mix_one_tokenizer"]
    assert "tokenizer_fingerprint and max_seq_len" in message
    assert "instruct (sample_instruct)" in message and "chat (sample_chat)" in message


def test_a_rerun_is_byte_identical_and_max_items_caps(lake_dir: Path) -> None:
    spec = mix("again.yaml", phases=TWO_PHASES, max_items=3)
    first = write_mix(spec, lake_dir / "lake", plan_mix(spec, lake_dir / "lake")).read_bytes()
    path = write_mix(spec, lake_dir / "lake", plan_mix(spec, lake_dir / "lake"))
    assert path == lake_dir / "lake" / "_mixes" / "again" / "mix.json" and path.read_bytes() == first
    assert all(b["rows"] <= 3 for p in read_json(path)["phases"] for b in p["buckets"].values())
    assert failed(judge_mix(spec, lake_dir / "lake")) == {}  # the published one


def test_tampered_mixes_fail_their_gates(lake_dir: Path) -> None:
    spec = mix(phases=TWO_PHASES, total_tokens=5000)
    plan = plan_mix(spec, lake_dir / "lake")
    assert "add up to 6,144" in failed(judge_mix(spec, lake_dir / "lake", plan))["training_mix_budgets"]
    bad = copy.deepcopy(plan)
    manifest = read_json(lake_dir / "lake" / "sample_text" / "manifest.json")
    bad["sources"]["text"]["files"][0]["path"] = "sample_text/" + manifest["splits"]["validation"]["files"][0]["path"]
    bad["sources"]["instruct"]["files"][0]["sha256"] = "0" * 64
    problems = failed(judge_mix(spec, lake_dir / "lake", bad))
    assert "training_mix_train_only" in problems and "training_mix_rows_in_manifest" in problems


WEB = {"weights": {"web": 1}, "duration_tokens": 256}


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"phases": TWO_PHASES, "colour": 1}, "m.yaml: colour: unknown key"),
        ({"phases": TWO_PHASES, "seed": "x"}, "m.yaml: seed:"),
        ({"phases": TWO_PHASES, "split": "validation"}, "validation and test rows never enter a training mix"),
        ({"weights": {"code": 1}, "duration_tokens": 10}, "phases.0.weights: unknown bucket(s) ['code']"),
        ({"phases": [{"name": "p", "duration_tokens": 0, "weights": {"text": 1}}]}, "phases.0.duration_tokens"),
        ({**WEB, "sources": {"web": {"dataset": "nope"}}}, "m.yaml: sources.web.dataset: unknown dataset 'nope'"),
        ({**WEB, "sources": {"web": {"dataset": "sample_text", "epochs": 2}}}, "m.yaml: sources.web.epochs: unknown"),
    ],
)
def test_spec_errors_name_the_file_and_key(raw: dict, needle: str) -> None:
    with pytest.raises(SpecError) as err:
        mix(**raw)
    assert needle in str(err.value)


def test_scan_keeps_the_valid_mixes_beside_a_broken_one(tmp_path: Path) -> None:
    shutil.copyfile(Path(__file__).resolve().parents[2] / "data" / "mixes" / "sample_mix.yaml", tmp_path / "a.yaml")
    (tmp_path / "b.yaml").write_text(
        yaml.safe_dump({"sources": {"x": "nope"}, "weights": {"x": 1}, "duration_tokens": 9})
    )
    scan = scan_mixes(tmp_path, DATASETS)
    assert [m.name for m in scan.mixes] == ["a"] and "b.yaml: sources.x.dataset: unknown dataset" in scan.broken["b"]


def test_the_loader_reads_a_mix_in_its_planned_order(lake_dir: Path) -> None:
    spec = mix("loaded.yaml", phases=TWO_PHASES)
    path = write_mix(spec, lake_dir / "lake", plan_mix(spec, lake_dir / "lake"))
    plan = read_json(path)
    rows = MixRows(path.parent)
    sources = {b: PackedRows(lake_dir / "lake" / d / "manifest.json") for b, d in
               (("instruct", "sample_instruct"), ("text", "sample_text"))}  # fmt: skip
    expected = [(p["name"], ["instruct", "text"][b], r) for p in plan["phases"] for b, r in p["order"]]
    assert len(rows) == len(expected) == 24
    for i, (phase, bucket, r) in enumerate(expected):
        row = rows[i]
        assert (row["phase"], row["bucket"], row["row_index"]) == (phase, bucket, r)
        assert (row["input_ids"] == sources[bucket][r]["input_ids"]).all()
    assert len(MixRows(path, phases=["main"])) == 16
    torch_mod = pytest.importorskip("prep_assets.torch")
    assert torch_mod.MixDataset(path)[3]["mix_index"] == 3

    corrupt = lake_dir / "lake" / plan["sources"]["text"]["files"][0]["path"]
    saved = corrupt.read_bytes()
    try:
        corrupt.write_bytes(saved[:-1] + bytes([saved[-1] ^ 1]))
        with pytest.raises(ShardIntegrityError):
            MixRows(path)
    finally:
        corrupt.write_bytes(saved)


def text_mix(name: str, **raw: Any):
    doc = {"sources": {"a": "sample_text", "b": {"dataset": "sample_text_b", "max_epochs": 2}}, **raw}
    return parse_mix(doc, path=Path(f"{name}.yaml"), default_name=name, datasets=DATASETS)


BLEND_PHASES = [
    {"name": "p1", "duration_tokens": 4096, "weights": {"a": 1, "b": 1}},
    {"name": "p2", "duration_tokens": 8192, "weights": {"a": 1, "b": 3}},
]
# a's cumulative demand 2048 + 4096 = 6144 tokens: its 24 rows × 256 hold it, its 5,840 document tokens do not
CURRICULUM = [
    {"name": "p1", "duration_tokens": 4096, "weights": {"a": 1, "b": 1}},
    {"name": "p2", "duration_tokens": 8192, "weights": {"a": 1, "b": 1}},
]


def test_the_megatron_blend_weighs_each_phases_prefixes_by_share_and_tokens(lake_dir: Path) -> None:
    lake = lake_dir / "lake"
    spec = text_mix("blend", phases=BLEND_PHASES, outputs=["megatron_blend"])
    path = write_mix(spec, lake, plan_mix(spec, lake))
    plan = read_json(path)
    datasets = {"a": "sample_text", "b": "sample_text_b"}
    entries = {b: [e for e in read_json(lake / d / "manifest.json")["splits"]["train"]["exports"]
                   if e["format"] == "megatron"] for b, d in datasets.items()}  # fmt: skip
    assert len(entries["a"]) == len(entries["b"]) == 2  # one prefix per drop
    total = {b: sum(e["tokens"] for e in entries[b]) for b in "ab"}
    for phase, shares in (("p1", {"a": 0.5, "b": 0.5}), ("p2", {"a": 0.25, "b": 0.75})):
        expected = [[round(shares[b] * e["tokens"] / total[b], 9), f"{datasets[b]}/{e['prefix']}"] for b in "ab"
                    for e in entries[b]]  # fmt: skip
        assert plan["outputs"]["megatron_blend"]["phases"][phase] == expected
        for _, prefix in expected:
            assert (lake / f"{prefix}.bin").is_file() and (lake / f"{prefix}.idx").is_file()
    lines = (path.parent / "megatron_blend.txt").read_text(encoding="utf-8").splitlines()
    args = [line for line in lines if line.startswith("--data-path ")]
    p2 = args[1].split()[1:]
    assert len(args) == 2 and len(p2) == 8 and p2[1].endswith("/train/megatron/text_document")
    assert math.isclose(sum(float(w) for w in p2[::2]), 1.0)

    with pytest.raises(MixOutputError, match=r"source\(s\) instruct \(sample_instruct\) write no megatron output"):
        plan_mix(mix("blend2.yaml", phases=TWO_PHASES, outputs=["megatron_blend"]), lake)


def _idx_tokens(idx: Path) -> int:
    """The token total of a GPT-Simple .idx (format_gpt_simple's layout): the last of its n + 1 offsets."""
    raw = idx.read_bytes()
    n = int.from_bytes(raw[12:16], "little")
    return int.from_bytes(raw[16 + 8 * n : 24 + 8 * n], "little", signed=True)


def test_the_gpt_simple_curriculum_layout_links_buckets_and_the_gate_counts_as_gpt_simple(lake_dir: Path) -> None:
    lake = lake_dir / "lake"
    spec = text_mix("curr", phases=CURRICULUM, outputs=["gpt_simple_curriculum"])
    path = write_mix(spec, lake, plan_mix(spec, lake))
    root = path.parent / "gpt_simple"
    manifest = read_json(lake / "sample_text/manifest.json")
    sources = {
        split: sorted(
            f["path"].rsplit("/", 1)[1]
            for e in manifest["splits"][split]["exports"]
            if e["format"] == "gpt_simple"
            for f in e["files"]
        )
        for split in ("train", "validation")
    }
    assert sorted(p.name for p in (root / "train/a").iterdir()) == [f"sample_text-{n}" for n in sources["train"]]
    assert sorted(p.name for p in (root / "train/b").iterdir()) == sorted(
        [f"sample_text_b-{n}" for n in sources["train"]] + [f"sample_text_b-e1-{n}" for n in sources["train"]]
    )  # max_epochs 2: the files twice, so GPT-Simple counts what the mix may use (sample_text_b: the same files)
    assert sorted(p.name for p in (root / "val/a").iterdir()) == [f"sample_text-{n}" for n in sources["validation"]]
    config = yaml.safe_load((root / "curriculum.yaml").read_text(encoding="utf-8"))["data"]
    assert config["curriculum"] == [{"duration_tokens": 4096, "mix": {"a": 1, "b": 1}},
                                    {"duration_tokens": 8192, "mix": {"a": 1, "b": 1}}]  # fmt: skip
    assert (config["format"], config["max_length"], config["allow_bucket_exhaustion"]) == ("pretokenized", 256, False)
    on_disk = {b: sum(_idx_tokens(p) for p in (root / "train" / b).glob("*.idx")) for b in "ab"}
    assert on_disk == read_json(path)["outputs"]["gpt_simple_curriculum"]["tokens"]
    inventory = {o.name: o for o in judge_mix(spec, lake)}["training_mix_inventory"]
    assert on_disk["a"] < 6144 < on_disk["b"]
    assert inventory.facts["curriculum_shortfalls"] == {"a": [6144.0, on_disk["a"], 6144.0 - on_disk["a"]]}
    assert read_json(path)["buckets"]["a"]["shortfall_rows"] == 0  # the rows suffice
    assert not inventory.passed and "Curriculum demands 6.1K from bucket 'a' but only 5.8K" in inventory.description
    for f in root.rglob("*.bin"):  # hard links of the sources' bytes
        assert f.stat().st_nlink >= 2
    allowed = text_mix("curr", phases=CURRICULUM, outputs=["gpt_simple_curriculum"], allow_bucket_exhaustion=True)
    outcome = {o.name: o for o in judge_mix(allowed, lake, plan_mix(allowed, lake))}["training_mix_inventory"]
    assert outcome.passed and "Curriculum demands 6.1K from bucket 'a'" in outcome.facts["warnings"][0]


@pytest.fixture
def gpt_simple_validate(gpt_simple_dir: Path) -> Iterator[Any]:
    """GPT-Simple's `validate` module, from gpt-simple-lm installed into a scratch folder."""
    with gpt_simple_modules(gpt_simple_dir, "validate") as (validate,):
        yield validate


@pytest.mark.parametrize("allow", [False, True])
def test_gpt_simples_validator_reports_our_inventory_gates_shortfall(
    lake_dir: Path, gpt_simple_validate: Any, allow: bool
) -> None:
    validate = gpt_simple_validate
    lake = lake_dir / "lake"
    spec = text_mix(f"gs{int(allow)}", phases=CURRICULUM, outputs=["gpt_simple_curriculum"],
                    allow_bucket_exhaustion=allow)  # fmt: skip
    path = write_mix(spec, lake, plan_mix(spec, lake))
    cfg = validate.Config.from_file(path.parent / "gpt_simple" / "curriculum.yaml")
    cfg.data.path = str(path.parent / "gpt_simple")
    report = validate.ValidationReport()
    info = validate._collect_data_info(cfg, report)
    theirs = validate._compute_curriculum_demand(cfg, info, report)
    assert not report.has_errors(), report.findings
    ours = {o.name: o for o in judge_mix(spec, lake)}["training_mix_inventory"]
    assert {b: list(v) for b, v in theirs["shortfall_by_bucket"].items()} == ours.facts["curriculum_shortfalls"]
    assert list(ours.facts["curriculum_shortfalls"]) == ["a"]
    assert report.has_budget_issues() is (not allow) and ours.passed is allow
    their_message = next(f.message for f in report.findings if f.code == "curriculum.shortfall.a")
    assert their_message.startswith("Curriculum demands 6.1K from bucket 'a' but only 5.8K available (304 short)")


def test_the_plot_draws_planned_and_achieved_bars_to_scale_deterministically() -> None:
    phase = {"name": "p", "buckets": {"a": {"demanded_tokens": 100, "row_tokens": 50}}}
    plan = {"bucket_order": ["a"], "sources": {"a": {}}, "phases": [phase]}
    data = plot_mix(plan)
    assert data == plot_mix(copy.deepcopy(plan)) and data.startswith(b"\x89PNG\r\n\x1a\n")
    width, height = struct.unpack(">II", data[16:24])
    idat = data.index(b"IDAT")
    (size,) = struct.unpack(">I", data[idat - 4 : idat])
    raw = zlib.decompress(data[idat + 4 : idat + 4 + size])
    pixels = np.frombuffer(raw, np.uint8).reshape(height, 1 + 3 * width)[:, 1:].reshape(height, width, 3)
    column = {tuple(c): int((pixels == c).all(axis=2).sum(axis=0).max()) for c in (PLANNED, PALETTE[0])}
    assert column[PLANNED] == 160 and column[PALETTE[0]] == 80  # planned is the tallest bar, achieved half


def test_a_typo_inside_a_phase_or_a_source_names_the_keys_allowed_there(tmp_path: Path):
    """Inside a list or a mapping of models the error said `allowed keys here: ?`."""
    from prep_assets.core.mix import scan_mixes

    (tmp_path / "m.yaml").write_text(
        "sources: {a: {dataset: a, max_epoch: 2}}\nphases: [{name: p, duration_tokens: 128, weigths: {a: 1.0}}]\n"
    )
    error = scan_mixes(tmp_path, {"a"}).broken["m"]
    assert "phases.0.weigths: unknown key; allowed keys here: name, duration_tokens, weights" in error
    assert "sources.a.max_epoch: unknown key; allowed keys here: dataset, max_epochs, domains" in error
    assert "?" not in error


def test_a_nan_or_infinite_weight_is_a_spec_error_not_a_traceback(tmp_path: Path):
    from prep_assets.core.mix import scan_mixes

    for name, weight in (("nan", ".nan"), ("inf", ".inf"), ("sum", "1.0e+308, c: 1.0e+308")):
        (tmp_path / f"{name}.yaml").write_text(
            "sources: {a: a, b: b, c: b}\n"
            f"phases: [{{name: p, duration_tokens: 128, weights: {{a: {weight}, b: 1}}}}]\n"
        )
    broken = scan_mixes(tmp_path, {"a", "b"}).broken
    assert all("give each bucket a finite weight >= 0" in broken[n] for n in ("nan", "inf", "sum")), broken


def test_two_buckets_on_one_dataset_are_refused_unless_their_domains_differ():
    """A row could be drawn by both: the mix took 24 rows of which 18 were distinct, every gate passing."""
    with pytest.raises(SpecError, match=r"buckets \['a', 'b'\] all draw on dataset 'sample_text'"):
        parse_mix(
            {"sources": {"a": "sample_text", "b": "sample_text"}, "weights": {"a": 1, "b": 1}, "duration_tokens": 8},
            path=Path("twice.yaml"),
            default_name="twice",
        )
    for domains in ([["x"], ["x", "y"]], [["x"], None]):
        sources = {b: {"dataset": "d", **({"domains": ds} if ds else {})} for b, ds in zip("ab", domains)}
        with pytest.raises(SpecError, match="all draw on dataset 'd'"):
            parse_mix(
                {"sources": sources, "weights": {"a": 1}, "duration_tokens": 8}, path=Path("m.yaml"), default_name="m"
            )
    apart = {"a": {"dataset": "d", "domains": ["x"]}, "b": {"dataset": "d", "domains": ["y"]}}
    assert parse_mix(
        {"sources": apart, "weights": {"a": 1}, "duration_tokens": 8}, path=Path("m.yaml"), default_name="m"
    )


def test_a_key_given_twice_or_a_boolean_or_quoted_number_is_a_mix_spec_error(tmp_path: Path):
    """PyYAML kept the last of two values, and pydantic read `yes` as 1.0 and '0.5' as 0.5, without a word."""
    head, one = "sources: {text: sample_text, instruct: sample_instruct}\n", "duration_tokens: 8\nweights: {text: 1}\n"
    cases = {
        "weight_twice": head + "duration_tokens: 2048\nweights: {text: 0.9, instruct: 0.1, text: 0.1}\n",
        "bucket_twice": "sources: {text: sample_text, text: sample_instruct}\n" + one,
        "yes_no": head + "duration_tokens: 2048\nweights: {text: yes, instruct: no}\n",
        "quoted": head + "duration_tokens: '2048'\nweights: {text: 1, instruct: 1}\n",
        "epochs_true": "sources: {text: {dataset: sample_text, max_epochs: true}}\n" + one,
        "exponent": head + "duration_tokens: 2048\nweights: {text: 1e-3, instruct: 1}\n",  # YAML 1.1 reads text
    }
    for name, text in cases.items():
        (tmp_path / f"{name}.yaml").write_text(text)
    (tmp_path / "dotted.yaml").write_text(head + "duration_tokens: 2048\nweights: {text: 1.0e-3, instruct: 1}\n")
    scan = scan_mixes(tmp_path, DATASETS)
    assert set(scan.broken) == set(cases), scan.broken
    assert "key 'text' is given twice" in scan.broken["weight_twice"] and "key 'text'" in scan.broken["bucket_twice"]
    assert "a number, not True" in scan.broken["yes_no"] and "a number, not the text '2048'" in scan.broken["quoted"]
    assert "a dot and a sign, as in 1.0e-3 or 2.0e+9" in scan.broken["exponent"]
    (dotted,) = scan.mixes
    assert dotted.phases[0].weights["text"] == 0.001


def test_a_mix_whose_bucket_ran_short_to_no_rows_reads_and_an_edited_order_is_refused(lake_dir: Path):
    """A published plan (allow_bucket_exhaustion) with a bucket of no train rows could not be opened, and an
    edited mix.json read a row twice, or the last row for -1, without a word."""
    lake = lake_dir / "lake"
    empty = lake / "sample_text_none"
    empty.mkdir(exist_ok=True)
    manifest = read_json(lake / "sample_text" / "manifest.json")
    manifest["splits"]["train"] = {**manifest["splits"]["train"], "files": [], "exports": []}
    (empty / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    doc = {"sources": {"text": "sample_instruct", "none": "sample_text_none"}, "weights": {"text": 1, "none": 1},
           "duration_tokens": 2048, "allow_bucket_exhaustion": True}  # fmt: skip
    spec = parse_mix(doc, path=Path("short.yaml"), default_name="short")
    path = write_mix(spec, lake, plan_mix(spec, lake))
    rows = MixRows(path)
    assert read_json(path)["buckets"]["none"]["rows"] == 0 and {r["bucket"] for r in rows} == {"text"}
    plan = read_json(path)
    plan["phases"][0]["order"][1] = [0, -1]
    path.write_text(json.dumps(plan), encoding="utf-8")
    with pytest.raises(ReadError, match="its bytes differ from those recorded when it was published"):
        MixRows(path)
    with pytest.raises(ReadError, match=r"order entry 1 names \[bucket, row\] \[0, -1\]"):
        MixRows(path, verify=False)
