"""Every column of every layer's Parquet schema is described for the UI, and a dataset's column schema lists
only the columns its record type fills."""

import pyarrow as pa
import pytest

from prep_assets.core import records
from prep_assets.core.columns import PREFERENCE_ONLY, TABULAR_ONLY, describe, shown_columns

SCHEMAS = {name: value for name, value in vars(records).items() if name.endswith("_SCHEMA")}
LAYER_OF = {  # the schema's layer, as `describe` and the UI name it
    "BRONZE_SCHEMA": "bronze",
    "BRONZE_REJECT_SCHEMA": "bronze_rejects",
    "SILVER_SCHEMA": "silver",
    "SILVER_REJECT_SCHEMA": "silver_rejects",
    "GOLD_SCHEMA": "gold",
    "GOLD_REJECT_SCHEMA": "gold_rejects",
    "SHARD_SCHEMA": "shards",
}


def test_every_field_of_every_layer_schema_has_a_description():
    assert set(SCHEMAS) == set(LAYER_OF) and all(isinstance(s, pa.Schema) for s in SCHEMAS.values())
    missing = [(n, f.name) for n, s in SCHEMAS.items() for f in s if not describe(f.name, LAYER_OF[n]).strip()]
    assert missing == []


@pytest.mark.parametrize(
    ("input_type", "hidden"),
    [
        ("text", {*PREFERENCE_ONLY, *TABULAR_ONLY}),
        ("instruction", {*PREFERENCE_ONLY, *TABULAR_ONLY}),
        ("chat", {*PREFERENCE_ONLY, *TABULAR_ONLY}),
        ("preference", set(TABULAR_ONLY)),
        ("tabular", set(PREFERENCE_ONLY)),
    ],
)
def test_the_displayed_gold_schema_holds_only_the_columns_the_type_fills(input_type: str, hidden: set[str]):
    names = records.GOLD_SCHEMA.names
    assert shown_columns(names, input_type) == [n for n in names if n not in {*hidden, "domain"}]
    if input_type != "tabular":  # a domain is per record: tables have none
        assert shown_columns(names, input_type, domains=True) == [n for n in names if n not in hidden]
