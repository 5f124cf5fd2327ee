from dagster import AssetKey

from prep_assets.definitions import build_definitions
from prep_assets_tests.conftest import SAMPLE_DATA

# asset -> (its `layer` tag, its Dagster kinds)
LAYERS = {
    "raw_records": ("bronze", {"parquet", "bronze"}),
    "clean_records": ("silver", {"parquet", "silver"}),
    "tokenizer": ("gold", {"huggingface", "gold"}),
    "tokenized_examples": ("gold", {"parquet", "gold"}),
    "packed_shards": ("shards", {"parquet", "gold"}),
    "dataset_manifest": ("shards", {"json", "gold"}),
}


def test_definitions_have_every_layer_per_dataset_in_the_datasets_group_with_lineage():
    defs = build_definitions(SAMPLE_DATA)
    graph = defs.resolve_asset_graph()
    datasets = ("sample_text", "sample_instruct", "sample_chat", "sample_pref", "sample_sensors")
    for ds in datasets:
        for name, (layer, kinds) in LAYERS.items():
            node = graph.get(AssetKey([ds, name]))
            assert node.group_name == ds, (ds, name)  # one group per dataset, the layer a tag and a kind
            assert node.tags["layer"] == layer and node.kinds == kinds, (ds, name)
            assert node.description
        parents = {k: {p.path[-1] for p in graph.get(AssetKey([ds, k])).parent_keys} for k in LAYERS}
        assert parents["clean_records"] == {"raw_records"}
        assert parents["tokenized_examples"] == {"clean_records", "tokenizer"}
        assert parents["packed_shards"] == {"tokenized_examples", "tokenizer"}
        assert parents["dataset_manifest"] == {"packed_shards", "tokenizer"}
        assert graph.get(AssetKey([ds, "raw_records"])).partitions_def.name == f"{ds}_drops"
        assert graph.get(AssetKey([ds, "tokenizer"])).partitions_def is None
    groups = {graph.get(k).group_name for k in graph.get_all_asset_keys()}
    assert groups == {*datasets, "mix_sample_mix"}  # no group per layer left; a mix is a group of its own


def test_every_partitioned_layer_has_blocking_gates():
    defs = build_definitions(SAMPLE_DATA)
    graph = defs.resolve_asset_graph()
    checks = {(k.asset_key.path[-1], k.name) for k in graph.asset_check_keys if k.asset_key.path[0] == "sample_text"}
    by_asset = {a for a, _ in checks}
    assert by_asset == {"raw_records", "clean_records", "tokenized_examples", "packed_shards", "dataset_manifest"}
    assert ("tokenized_examples", "tokenized_examples_mask_aligned") in checks
    assert ("packed_shards", "packed_shards_positions_restart") in checks
    # sample_text: dedup_scope dataset
    assert {
        ("clean_records", "clean_records_unique_across_drops"),
        ("dataset_manifest", "dataset_manifest_duplicates_kept"),
    } <= checks
    assert ("clean_records", "clean_records_split_drawn") in checks  # sample_text holds out validation
    assert len(checks) == 23
    specs = [s for c in defs.asset_checks or [] for s in c.check_specs]  # type: ignore[union-attr]
    # 20 per dataset, plus the two preference pair gates of sample_pref and sample_text's two across-drops
    # gates; the within-drop duplicates gate of the three datasets deduplicating drop by drop (not sample_text,
    # nor sample_sensors); sample_sensors (tabular, no dedup) has the tabular budget gate instead of the
    # uniqueness one; and the five gates of the sample mix; the split gate in the four datasets holding records
    # out by content (not sample_sensors, split by group); sample_sensors' manifest has the one-table-schema gate
    # and the groups-in-one-split gate
    assert len(specs) == 5 * 20 + 4 + 3 + 4 + 5 + 2 and all(s.blocking for s in specs)
    sensors = {k.name for k in graph.asset_check_keys if k.asset_key.path[0] == "sample_sensors"}
    assert "tokenized_examples_tabular_budget" in sensors and "clean_records_unique" not in sensors
    assert "dataset_manifest_one_table_schema" in sensors
    pref = {k.name for k in graph.asset_check_keys if k.asset_key.path[0] == "sample_pref"}
    assert {"tokenized_examples_pairs_complete", "packed_shards_pairs_together"} <= pref


def test_jobs_per_dataset():
    defs = build_definitions(SAMPLE_DATA)
    for ds in ("sample_text", "sample_instruct", "sample_chat", "sample_pref"):
        for job in (f"{ds}_tokenizer", f"{ds}_drops", f"{ds}_manifest"):
            assert defs.resolve_job_def(job) is not None


def test_empty_data_dir_gives_empty_definitions(tmp_path):
    assert list(build_definitions(tmp_path).resolve_asset_graph().get_all_asset_keys()) == []


def test_a_running_drop_and_manifest_sensor_per_dataset():
    from dagster import DefaultSensorStatus

    defs = build_definitions(SAMPLE_DATA)
    sensors = {s.name: s for s in defs.sensors or []}
    datasets = ("sample_text", "sample_instruct", "sample_chat", "sample_pref", "sample_sensors")
    assert set(sensors) == (
        {f"{ds}_drops_sensor" for ds in datasets}
        | {f"{ds}_manifest_sensor" for ds in datasets}
        | {"prep_assets_automation"}
    )
    assert all(s.default_status == DefaultSensorStatus.RUNNING for s in sensors.values())
    assert sensors["sample_text_manifest_sensor"].job_name == "sample_text_manifest"
    text = sensors["sample_text_drops_sensor"]
    assert text.default_status == DefaultSensorStatus.RUNNING
    # the whole drop job of new drops; silver alone to rebuild it when earlier drops changed (dedup_scope dataset)
    assert text.job_name == "sample_text_drops"


def test_a_broken_spec_becomes_its_own_error_asset_and_every_other_dataset_loads(tmp_path):
    from dagster import materialize

    from prep_assets.definitions import SPEC_ERROR
    from prep_assets_tests.conftest import copy_sample_data

    data = copy_sample_data(tmp_path / "data")
    (data / "datasets" / "typo.yaml").write_text("input: {type: text, colour: red}\ntokenizer: {path: x}\n")
    defs = build_definitions(data)
    graph = defs.resolve_asset_graph()
    broken = graph.get(AssetKey(["typo", SPEC_ERROR]))
    assert "input.colour: unknown key" in broken.description and broken.group_name == "typo"
    assert graph.get(AssetKey(["sample_text", "packed_shards"])) is not None
    assert {s.name for s in defs.sensors} >= {"sample_text_drops_sensor", "sample_chat_manifest_sensor"}
    result = materialize([defs.get_assets_def(AssetKey(["typo", SPEC_ERROR]))], raise_on_error=False)
    assert not result.success
    only = build_definitions(data, dataset="sample_text").resolve_asset_graph()
    assert {k.path[0] for k in only.get_all_asset_keys()} == {"sample_text"}


def test_a_broken_spec_whose_file_name_dagster_would_refuse_still_loads_as_an_error_asset(tmp_path):
    from prep_assets.definitions import SPEC_ERROR
    from prep_assets_tests.conftest import copy_sample_data

    data = copy_sample_data(tmp_path / "data")
    (data / "datasets" / "en-wiki.v2.yaml").write_text("input: {type: text}\ntokenizer: {path: x}\n")
    graph = build_definitions(data).resolve_asset_graph()
    broken = graph.get(AssetKey(["en_wiki_v2", SPEC_ERROR]))
    assert "en-wiki.v2.yaml" in broken.description and broken.group_name == "en_wiki_v2"


def test_column_schemas_describe_every_column_and_list_only_the_ones_the_type_fills():
    graph = build_definitions(SAMPLE_DATA).resolve_asset_graph()

    def columns(ds: str, name: str) -> dict[str, str]:
        schema = graph.get(AssetKey([ds, name])).metadata["dagster/column_schema"]
        return {c.name: c.description for c in schema.columns}

    for ds in ("sample_text", "sample_instruct", "sample_chat", "sample_pref", "sample_sensors"):
        for name in ("raw_records", "clean_records", "tokenized_examples", "packed_shards"):
            assert all(columns(ds, name).values()), (ds, name)
    preference, tabular = {"pair_id", "branch", "shared_prefix_tokens"}, {"record_ids", "group_keys"}
    assert not (preference | tabular) & set(columns("sample_instruct", "tokenized_examples"))
    assert preference <= set(columns("sample_pref", "tokenized_examples"))
    assert tabular <= set(columns("sample_sensors", "tokenized_examples"))
    assert not preference & set(columns("sample_sensors", "tokenized_examples"))
    assert "normalize" in columns("sample_text", "clean_records")["content"]  # silver says content differently
