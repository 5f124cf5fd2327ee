"""Tiny hand-checkable layer files for the invariant and gate tests: gold examples, shard rows, silver records
with gold rejects (a helper module: test modules import it, never each other)."""

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from prep_assets.core.records import GOLD_REJECT_SCHEMA, GOLD_SCHEMA, SHARD_SCHEMA, SILVER_SCHEMA

# a good gold example: three tokens, the first masked, the last EOS
GOOD = {"token_ids": [5, 6, 7], "loss_mask": [0, 1, 1], "token_type_ids": [1, 1, 3]}
# the shard gates that read the shared pass over the shard rows (`inv.shard_rows`)
BY_ROWS = ["packed_shards_fixed_length", "packed_shards_positions_restart", "packed_shards_match_gold"]


def write_gold(dir_: Path, rows: list[dict]) -> Path:
    """Gold examples d:1, d:2, ... of f.jsonl lines 1, 2, ..., their counts taken from their lists."""
    dir_.mkdir(parents=True, exist_ok=True)
    base = {"drop": "d", "source_file": "f.jsonl", "byte_offset": 0, "split": "train"}
    full = [
        {
            **base,
            "example_id": f"d:{i + 1}",
            "record_id": f"d:{i + 1}",
            "source_line": i + 1,
            "num_tokens": len(r["token_ids"]),
            "num_loss_tokens": sum(r["loss_mask"]),
            "num_prompt_tokens": 0,
            **r,
        }
        for i, r in enumerate(rows)
    ]
    pq.write_table(pa.Table.from_pylist(full, schema=GOLD_SCHEMA), dir_ / "examples.parquet")
    return dir_


def write_shard(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SHARD_SCHEMA), path)
    return path


def shard_row(**over: object) -> dict:
    """A row of 4 holding GOOD (d:1) and one padding token; `over` replaces columns."""
    row = {
        "input_ids": [5, 6, 7, 0],
        "loss_mask": [0, 1, 1, 0],
        "position_ids": [0, 1, 2, 0],
        "segment_ids": [1, 1, 1, 0],
        "token_type_ids": [1, 1, 3, 2],
        "seq_lengths": [3],
        "example_ids": ["d:1"],
        "example_offsets": [0],
        "num_loss_tokens": 2,
    }
    row.update(over)
    return row


def shard_row8(**over: list) -> dict:
    """`shard_row`'s tokens, padded to 8 (the smallest max_seq_len a spec takes); `over` replaces the unpadded
    token lists."""
    base = {
        "input_ids": [5, 6, 7],
        "loss_mask": [0, 1, 1],
        "position_ids": [0, 1, 2],
        "segment_ids": [1, 1, 1],
        "token_type_ids": [1, 1, 3],
    }
    base.update(over)
    return shard_row(**{k: v + ([2] * 5 if k == "token_type_ids" else [0] * 5) for k, v in base.items()})


def write_silver_and_gold_rejects(tmp_path: Path, records: int, rejects: list[tuple[str, int]]) -> tuple[Path, Path]:
    """`records` silver records; gold rejects (reason, source_line) among them."""
    s, g = tmp_path / "s", tmp_path / "g"
    s.mkdir(parents=True), g.mkdir(parents=True)
    prov = {"drop": "d", "source_file": "f.jsonl", "byte_offset": 0, "split": "train"}
    pq.write_table(
        pa.Table.from_pylist(
            [
                {
                    **prov,
                    "record_id": f"d:{i}",
                    "source_line": i,
                    "content": "{}",
                    "content_sha256": str(i),
                    "num_chars": 5,
                }
                for i in range(1, records + 1)
            ],
            schema=SILVER_SCHEMA,
        ),
        s / "records.parquet",
    )
    pq.write_table(
        pa.Table.from_pylist(
            [
                {
                    **prov,
                    "record_id": f"d:{line}",
                    "source_line": line,
                    "reason": reason,
                    "detail": f"why {line}",
                    "num_tokens": 0,
                }
                for reason, line in rejects
            ],
            schema=GOLD_REJECT_SCHEMA,
        ),
        g / "rejects.parquet",
    )
    return s, g
