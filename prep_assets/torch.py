"""PyTorch datasets over a manifest split and the collator that turns packed rows into model inputs.

The reading, ordering and cursor logic is `prep_assets.core.reading` (torch-free); this module adds only torch's
Dataset types and tensors. Conventions (labels unshifted, padding as its own cu_seqlens segment, the sharding
and resume scheme): docs/training.md.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

try:
    import torch
    from torch.utils.data import Dataset, IterableDataset, get_worker_info
except ImportError as e:  # the core install is torch-free
    raise ImportError("prep_assets.torch needs PyTorch: pip install 'prep_assets[torch]'") from e

from prep_assets.core import reading
from prep_assets.core.reading import MixRows, PackedRows, Row

Manifests = str | Path | Sequence[str | Path]


class PackedDataset(Dataset):
    """Map-style: row i of the split (numpy arrays per column, `row_index` = i). Verified when built; shuffle
    with a sampler, or index in `reading.order(len(ds), seed, epoch)`."""

    def __init__(
        self, manifests: Manifests, split: str = "train", *, verify: bool = True, pairs: bool = False
    ) -> None:
        self.rows = PackedRows(manifests, split, verify=verify, pairs=pairs)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> Row:
        return self.rows[index]


class MixDataset(Dataset):
    """Map-style over a training mix (`lake/_mixes/<name>/`): item i is the mix's i-th row in its planned order
    (iterate with the default sequential sampler), with `bucket` and `phase`; verified when built."""

    def __init__(self, mix: str | Path, *, phases: Sequence[str] | None = None, verify: bool = True) -> None:
        self.rows = MixRows(mix, phases=phases, verify=verify)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> Row:
        return self.rows[index]


class PackedIterableDataset(IterableDataset):
    """One epoch of the rank's stream in seeded order, from the cursor on, split over DataLoader workers in chunks
    of `batch_size` (give the DataLoader the same batch size, and the same `drop_last`). The training loop calls
    `advance(batch)` for each batch it consumes; `state_dict()` is then the cursor a new dataset resumes from, with
    any worker count, over the same rows (a cursor saved over other rows is refused mid-epoch)."""

    def __init__(
        self,
        manifests: Manifests,
        split: str = "train",
        *,
        batch_size: int,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        verify: bool = True,
        drop_last: bool = False,
        pairs: bool = False,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        dist = torch.distributed.is_available() and torch.distributed.is_initialized()
        self.rank = rank if rank is not None else (torch.distributed.get_rank() if dist else 0)
        self.world_size = world_size if world_size is not None else (torch.distributed.get_world_size() if dist else 1)
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in 0..{self.world_size - 1}")
        self.rows = PackedRows(manifests, split, verify=verify, pairs=pairs)
        self.batch_size, self.drop_last = batch_size, drop_last
        self.stream = reading.stream_id(self.rows.files, split, self.rank, self.world_size)
        self.cursor = reading.new_cursor(seed)
        if drop_last and self.stream_len == 0:
            raise ValueError(
                f"rank {self.rank}'s stream of {self.rank_rows} rows holds no whole batch of {batch_size}: with "
                "drop_last nothing would ever be yielded"
            )

    @property
    def rank_rows(self) -> int:
        """Rows in this rank's stream per epoch."""
        return len(range(self.rank, len(self.rows), self.world_size))

    @property
    def stream_len(self) -> int:
        """Where this rank's epoch ends: after its rows, or with `drop_last` after the last whole batch counted from
        the cursor (batches of another size before a resume leave the same rows over)."""
        rows = self.rank_rows
        return rows - (rows - self.cursor["consumed"]) % self.batch_size if self.drop_last else rows

    def __len__(self) -> int:
        return self.stream_len - self.cursor["consumed"]

    def __iter__(self):
        c = self.cursor
        positions = reading.rank_positions(len(self.rows), c["seed"], c["epoch"], self.rank, self.world_size)
        positions = positions[c["consumed"] : self.stream_len]
        if c["consumed"] and 0 < len(positions) < self.batch_size:  # a resumed epoch left with a partial batch
            warnings.warn(
                f"{len(positions)} rows are left in this epoch, less than a batch: a DataLoader with drop_last=True "
                "never yields them, and the epoch would never end; give the dataset drop_last=True too",
                stacklevel=2,
            )
        info = get_worker_info()
        if info is not None:
            positions = reading.worker_positions(positions, self.batch_size, info.id, info.num_workers)
        for p in positions.tolist():
            yield self.rows[p]

    def advance(self, batch: Mapping[str, Any] | int) -> None:
        """Count a consumed batch (or that many rows); the last batch of the epoch moves the cursor to the next."""
        n = batch if isinstance(batch, int) else len(batch["input_ids"])
        left = self.stream_len - self.cursor["consumed"]
        if n != self.batch_size and n != left:
            raise ValueError(
                f"a batch of {n} rows with {left} left in the epoch: the DataLoader's batch_size must be the "
                f"dataset's ({self.batch_size}), or the cursor would not name the rows consumed"
            )
        self.cursor = reading.advance(self.cursor, n, self.stream_len)
        if self.cursor["consumed"] == 0:  # a new epoch: its workers start from this process' view of the files
            self.rows.refresh()

    def state_dict(self) -> dict[str, Any]:
        return {**self.cursor, "stream": self.stream}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from a cursor. Mid-epoch it must count the same rows (`reading.stream_id`): over a changed lake,
        split, rank or world size its count would repeat some rows and skip others. At an epoch's start it holds
        only the epoch and the seed, and fits any rows."""
        cursor = reading.check_cursor(dict(state))
        stream = cursor.pop("stream", None)
        if cursor["consumed"] and stream is None:
            warnings.warn(f"cursor {cursor} records no stream: it cannot be checked against these rows", stacklevel=2)
        elif cursor["consumed"] and stream != self.stream:
            raise ValueError(
                f"cursor {dict(state)} was saved over other rows than this dataset's (stream {self.stream}: the "
                "manifest's files, the split, the rank or the world size differ); resuming it mid-epoch would repeat "
                "some rows and skip others. Resume from the epoch's start (consumed 0) or the next epoch."
            )
        if cursor["consumed"] > self.rank_rows:
            raise ValueError(f"cursor {cursor} is past this rank's stream of {self.rank_rows} rows")
        self.cursor = cursor
        if cursor["consumed"] and cursor["consumed"] == self.stream_len:  # its epoch's last batch was consumed
            self.cursor = reading.advance(cursor, 0, self.stream_len)


def collate_packed(rows: Sequence[Row], *, block_mask: bool = False) -> dict[str, Any]:
    """A batch of shard rows as model inputs: `input_ids`, `labels` (unshifted, -100 off the loss mask and on
    every segment start), `position_ids`, `segment_ids` (int64 [B, L]), `cu_seqlens` (int32, padding a segment of
    its own), `max_seqlen`, `row_index`; with `block_mask`, `attention_mask` bool [B, 1, L, L] (`additive_mask`
    makes the float form eager attention adds)."""
    stack = {c: np.stack([r[c] for r in rows]) for c in ("input_ids", "loss_mask", "position_ids", "segment_ids")}
    cu, max_seqlen = reading.cu_seqlens_of(stack["segment_ids"])
    batch: dict[str, Any] = {
        "input_ids": torch.from_numpy(stack["input_ids"].astype(np.int64)),
        "labels": torch.from_numpy(reading.labels_of(stack["input_ids"], stack["loss_mask"], stack["segment_ids"])),
        "position_ids": torch.from_numpy(stack["position_ids"].astype(np.int64)),
        "segment_ids": torch.from_numpy(stack["segment_ids"].astype(np.int64)),
        "cu_seqlens": torch.from_numpy(cu),
        "max_seqlen": max_seqlen,
        "row_index": torch.tensor([int(r["row_index"]) for r in rows], dtype=torch.int64),
    }
    if block_mask:
        batch["attention_mask"] = torch.from_numpy(reading.block_mask_of(stack["segment_ids"]))
    return batch


def additive_mask(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A bool attention mask as the float one attention adds to its scores: 0 where True, the dtype's lowest
    finite value where False (finite, so no softmax row becomes NaN)."""
    return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)
