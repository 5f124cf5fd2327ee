"""The PyTorch loader on real packed shards: attention isolation against a real Llama, resume across worker
counts and ranks, errors before the first batch, and HF datasets reading the same rows.

The parity figures are printed (run with -s).
"""

from __future__ import annotations

import json
import re
import runpy
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the loader tests need PyTorch: pip install 'prep_assets[torch]'")
transformers = pytest.importorskip("transformers")
from torch.nn.functional import cross_entropy  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from prep_assets.core import reading  # noqa: E402
from prep_assets.core.errors import ManifestMismatchError, ShardIntegrityError, SplitNotFoundError  # noqa: E402
from prep_assets.torch import (  # noqa: E402
    PackedDataset,
    PackedIterableDataset,
    additive_mask,
    collate_packed,
)
from prep_assets_tests.conftest import PROJECT, build_packed_lake  # noqa: E402

TOLERANCE = 1e-4  # per-token loss, packed with the block mask vs. each segment alone
CAUSAL_MARGIN = 1e-2  # a plain causal mask must miss the per-segment losses by more than this


@pytest.fixture(scope="module")
def llama():
    """A tiny randomly initialised Llama over TinyLlama's vocabulary; eager attention adds our float mask."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=32000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        initializer_range=0.2,  # peaked attention: what a segment would see of another shows in the loss
    )
    config._attn_implementation = "eager"
    return transformers.LlamaForCausalLM(config).eval()


def token_losses(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """[B, L] cross entropy of predicting token t from position t-1 (NaN at t = 0)."""
    ce = cross_entropy(logits[:, :-1].transpose(1, 2), input_ids[:, 1:], reduction="none")
    return torch.cat([torch.full_like(ce[:, :1], float("nan")), ce], dim=1)


def alone_losses(model, pieces: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each piece's token losses as a sequence of its own (positions 0..n-1), in one forward: right padding under
    the causal mask is never attended by a piece's own tokens."""
    n = max(len(p) for p in pieces)
    ids = torch.stack([torch.cat([p, p.new_zeros(n - len(p))]) for p in pieces])
    losses = token_losses(model(input_ids=ids).logits, ids)
    return [losses[i, : len(p)] for i, p in enumerate(pieces)]


def segments(seg: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each non-padding segment of one row."""
    bounds = [0, *(np.flatnonzero(np.diff(seg)) + 1).tolist(), len(seg)]
    return [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if seg[a] > 0]


def test_packed_losses_equal_each_segment_alone_and_causal_ones_do_not(packed_lakes, llama, capsys):
    ds = PackedDataset(list(packed_lakes.values()), "train")
    loader = DataLoader(ds, batch_size=8, collate_fn=lambda rows: collate_packed(rows, block_mask=True))
    max_diff, causal_diffs, n_rows, n_segments, raw_unmasked_starts = 0.0, [], 0, 0, 0
    with torch.no_grad():
        for batch in loader:
            ids, seg = batch["input_ids"], batch["segment_ids"].numpy()
            mask = additive_mask(batch["attention_mask"])
            logits = llama(input_ids=ids, attention_mask=mask, position_ids=batch["position_ids"]).logits
            packed = token_losses(logits, ids)
            plain = token_losses(llama(input_ids=ids, position_ids=torch.arange(ids.shape[1])[None]).logits, ids)
            # HF's own loss (it shifts the labels) over the packed logits
            hf_loss = llama.loss_function(logits=logits, labels=batch["labels"], vocab_size=llama.config.vocab_size)
            spans = [segments(seg[b]) for b in range(len(ids))]
            alone = alone_losses(llama, [ids[b, s:e] for b in range(len(ids)) for s, e in spans[b]])
            targets, alone_target_losses = batch["labels"] != -100, []
            for b in range(len(ids)):
                row_causal = 0.0
                for k, (s, e) in enumerate(spans[b]):
                    own = alone.pop(0)
                    max_diff = max(max_diff, (packed[b, s + 1 : e] - own[1:]).abs().max().item() if e - s > 1 else 0)
                    if k > 0:
                        row_causal = max(row_causal, (plain[b, s + 1 : e] - own[1:]).abs().max().item())
                    # the segment's first token is never a target (it would be predicted from the one before)
                    assert batch["labels"][b, s] == -100
                    raw_unmasked_starts += int(ds[int(batch["row_index"][b])]["loss_mask"][s])
                    alone_target_losses.append(own[targets[b, s:e]])
                    n_segments += 1
                if len(spans[b]) > 1:
                    causal_diffs.append(row_causal)
                n_rows += 1
            # HF's own shift of the labels gives the mean of exactly those per-segment target losses
            assert abs(hf_loss.item() - torch.cat(alone_target_losses).mean().item()) < TOLERANCE
    with capsys.disabled():  # the figures in every test run's output
        print(
            f"\nparity: rows={n_rows} segments={n_segments} max_abs_loss_diff={max_diff:.2e} "
            f"causal_min_diff={min(causal_diffs):.3f} (over {len(causal_diffs)} rows of >=2 segments) "
            f"segment starts with a loss in the shards: {raw_unmasked_starts}"
        )
    assert n_rows >= 100 and len(causal_diffs) >= 20
    assert max_diff < TOLERANCE
    assert min(causal_diffs) > CAUSAL_MARGIN


def test_collated_batch_conventions(packed_lakes):
    ds = PackedDataset(packed_lakes["instruct"], "train")
    rows = [ds[i] for i in range(4)]
    batch = collate_packed(rows, block_mask=True)
    B, L = batch["input_ids"].shape
    assert batch["input_ids"].dtype == torch.int64 and batch["cu_seqlens"].dtype == torch.int32
    # cu_seqlens: each row's segments (seq_lengths) then its padding, as one segment, over the flattened batch
    lengths = []
    for r in rows:
        pad = L - int(sum(r["seq_lengths"]))
        lengths += [*r["seq_lengths"].tolist(), *([pad] if pad else [])]
    assert batch["cu_seqlens"].tolist() == np.cumsum([0, *lengths]).tolist() and batch["max_seqlen"] == max(lengths)
    labels, mask = batch["labels"], batch["attention_mask"]
    for b, r in enumerate(rows):
        keep = r["loss_mask"] == 1
        assert (labels[b][torch.from_numpy(~keep)] == -100).all()
        assert torch.equal(labels[b][torch.from_numpy(keep)], batch["input_ids"][b][torch.from_numpy(keep)])
        seg = r["segment_ids"]
        for q in range(L):
            want = (seg == seg[q]) & (np.arange(L) <= q) if seg[q] > 0 else np.arange(L) == q
            assert mask[b, 0, q].numpy().tolist() == want.tolist()


def test_hf_builds_the_same_block_mask_from_restarting_positions(packed_lakes, llama):
    """transformers (5.x) turns position ids that restart at 0 into a block-diagonal mask when no mask and no cache
    are given: the shard's position_ids alone then isolate the segments too."""
    ds = PackedDataset(packed_lakes["chat"], "train")
    batch = collate_packed([ds[i] for i in range(8)], block_mask=True)
    ids, positions, real = batch["input_ids"], batch["position_ids"], batch["segment_ids"] > 0
    with torch.no_grad():
        ours = llama(input_ids=ids, attention_mask=additive_mask(batch["attention_mask"]), position_ids=positions)
        theirs = llama(input_ids=ids, position_ids=positions, use_cache=False)
    assert (ours.logits[real] - theirs.logits[real]).abs().max().item() < TOLERANCE


def _take(ds: PackedIterableDataset, workers: int, batches: int | None) -> list[int]:
    """Rows of up to `batches` batches of a DataLoader over `ds` (all when None), each counted by `advance`."""
    loader = DataLoader(ds, batch_size=ds.batch_size, num_workers=workers, collate_fn=collate_packed)
    seen: list[int] = []
    for i, batch in enumerate(loader):
        if batches is not None and i == batches:
            break
        seen += batch["row_index"].tolist()
        ds.advance(batch)
    return seen


def _counts(cursor: dict) -> dict:
    """A cursor's counts, without the stream id it names its rows by."""
    return {k: cursor[k] for k in ("epoch", "seed", "consumed")}


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
@pytest.mark.parametrize(("world_size", "after"), [(1, 0), (1, 3), (2, 3)])
def test_resume_with_another_worker_count_yields_exactly_the_rest(packed_lakes, world_size: int, after: int):
    manifests = list(packed_lakes.values())
    total = len(reading.PackedRows(manifests, "train"))
    union: list[int] = []
    for rank in range(world_size):
        first = PackedIterableDataset(manifests, batch_size=8, seed=7, rank=rank, world_size=world_size)
        head = _take(first, workers=2, batches=5)  # 5 batches: one worker a batch ahead of the other
        state = json.loads(json.dumps(first.state_dict()))  # a cursor survives JSON
        assert _counts(state) == {"epoch": 0, "seed": 7, "consumed": 40} and state["stream"] == first.stream
        resumed = PackedIterableDataset(manifests, batch_size=8, rank=rank, world_size=world_size)
        resumed.load_state_dict(state)
        tail = _take(resumed, workers=after, batches=None)
        # the stream's own order, whatever the workers: the rank's positions of the seeded permutation
        assert head + tail == reading.rank_positions(total, 7, 0, rank, world_size).tolist()
        assert _counts(resumed.state_dict()) == {"epoch": 1, "seed": 7, "consumed": 0}
        union += head + tail
    assert sorted(union) == list(range(total))


def test_next_epoch_is_another_order_of_all_rows(packed_lakes):
    ds = PackedIterableDataset(packed_lakes["chat"], batch_size=4, seed=3)
    one, two = _take(ds, 0, None), _take(ds, 0, None)
    assert sorted(one) == sorted(two) == list(range(len(ds.rows))) and one != two
    with pytest.raises(ValueError, match="batch_size"):
        ds.advance(3)


@pytest.fixture
def lake_copy(packed_lakes, tmp_path: Path) -> Path:
    """A copy of the instruct lake (manifest + shards) this test may damage."""
    return shutil.copytree(packed_lakes["instruct"].parent, tmp_path / "instruct") / "manifest.json"


@pytest.mark.parametrize("cls", [PackedDataset, PackedIterableDataset])
def test_a_changed_shard_is_refused_before_the_first_batch(lake_copy: Path, cls):
    shard = lake_copy.parent / json.loads(lake_copy.read_text())["splits"]["train"]["files"][0]["path"]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(ShardIntegrityError, match=f"{shard}: sha256 differs"):
        cls(lake_copy.parent, "train", batch_size=4) if cls is PackedIterableDataset else cls(lake_copy, "train")
    shard.unlink()
    with pytest.raises(ShardIntegrityError, match=f"{shard}: shard file named in the manifest is missing"):
        PackedDataset(lake_copy)


def test_a_missing_split_is_refused_naming_the_others(packed_lakes):
    with pytest.raises(SplitNotFoundError, match=r"split 'test' has no shard files; .*\['train', 'validation'\]"):
        PackedIterableDataset(packed_lakes["text"], "test", batch_size=4)


def test_manifests_of_other_tokenizers_or_lengths_are_not_read_together(packed_lakes, tmp_path: Path):
    gpt2 = build_packed_lake(tmp_path / "gpt2", "text", tokenizer="gpt2")
    with pytest.raises(ManifestMismatchError, match="disagree on tokenizer_fingerprint"):
        PackedIterableDataset([packed_lakes["text"], gpt2], batch_size=4)
    shorter = build_packed_lake(tmp_path / "short", "text", max_seq_len=64)
    with pytest.raises(ManifestMismatchError, match=r"disagree on max_seq_len .*: 128, .*: 64"):
        PackedDataset([packed_lakes["text"], shorter])


def test_hf_datasets_reads_the_same_rows(packed_lakes, hf_datasets):
    rows = reading.PackedRows(packed_lakes["chat"], "validation")
    hf = hf_datasets.load_dataset("parquet", data_files=[str(f.path) for f in rows.files], split="train")
    assert len(hf) == len(rows)
    for i, r in enumerate(rows):
        for column in reading.TOKEN_COLUMNS + ("seq_lengths", "example_ids", "num_loss_tokens"):
            want = r[column]
            assert hf[i][column] == (want.tolist() if isinstance(want, np.ndarray) else want), (i, column)


def test_the_core_install_runs_without_torch():
    """Only prep_assets.torch imports torch (transformers loads it on its own where it is installed)."""
    hidden = "import sys; sys.modules['torch'] = None; "  # any `import torch` now fails, as on an install without it
    code = hidden + "import prep_assets.core.reading, prep_assets.cli; print(sys.modules['torch'] is not None)"
    out = subprocess.run([sys.executable, "-c", code], cwd=PROJECT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    own = [p for p in (PROJECT / "prep_assets").rglob("*.py") if "import torch" in p.read_text(encoding="utf-8")]
    assert own == [PROJECT / "prep_assets" / "torch.py"]


def test_the_training_doc_snippets_run_as_written(
    packed_lakes, hf_datasets, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """docs/training.md's PyTorch and HF datasets snippets over a lake at the path they name; the PyTorch one run
    twice: the second resumes from the cursor the first wrote after its first batch."""
    doc = (PROJECT / "docs" / "training.md").read_text(encoding="utf-8")
    torch_snippet, hf_snippet = re.findall(r"```python\n(.*?)```", doc, re.S)
    lake = tmp_path / "data" / "lake"
    lake.mkdir(parents=True)
    shutil.copytree(packed_lakes["instruct"].parent, lake / "sample_instruct")
    monkeypatch.chdir(tmp_path)
    for name, code in (("torch_snippet", torch_snippet), ("hf_snippet", hf_snippet)):
        (tmp_path / f"{name}.py").write_text(code, encoding="utf-8")
    first = runpy.run_path(str(tmp_path / "torch_snippet.py"))
    rows = len(first["ds"].rows)
    assert _counts(first["ds"].state_dict()) == {"epoch": 1, "seed": 0, "consumed": 0}
    assert first["step"] == -(-rows // 8) - 1
    assert _counts(json.loads((tmp_path / "cursor.json").read_text())) == {"epoch": 0, "seed": 0, "consumed": 8}
    second = runpy.run_path(str(tmp_path / "torch_snippet.py"))  # resumes after the first batch
    assert _counts(second["ds"].state_dict()) == {"epoch": 1, "seed": 0, "consumed": 0}
    assert second["step"] == first["step"] - 1  # resumed after step 0
    assert len(runpy.run_path(str(tmp_path / "hf_snippet.py"))["ds"]) == len(PackedDataset(lake / "sample_instruct"))


def test_a_cursor_saved_over_other_rows_is_refused_mid_epoch_and_fits_any_rows_at_an_epochs_start(
    packed_lakes, tmp_path: Path
):
    ds = PackedIterableDataset(packed_lakes["text"], batch_size=4, seed=1)
    ds.advance(4)
    mid = ds.state_dict()
    more = build_packed_lake(tmp_path / "more", "text")  # a second manifest: the split holds more rows
    grown = PackedIterableDataset([packed_lakes["text"], more], batch_size=4)
    with pytest.raises(ValueError, match="saved over other rows .*repeat some rows and skip others"):
        grown.load_state_dict(mid)
    other_rank = PackedIterableDataset(packed_lakes["text"], batch_size=4, rank=1, world_size=2)
    with pytest.raises(ValueError, match="saved over other rows"):
        other_rank.load_state_dict(mid)
    grown.load_state_dict({**mid, "epoch": 2, "consumed": 0})  # an epoch's start: only the epoch and the seed count
    assert _counts(grown.state_dict()) == {"epoch": 2, "seed": 1, "consumed": 0}
    with pytest.warns(UserWarning, match="records no stream"):  # a cursor saved before streams were recorded
        grown.load_state_dict(_counts(mid))
    for bad in ({**mid, "consumed": True}, {**mid, "stream": 5}, {**mid, "extra": 1}):
        with pytest.raises(ValueError, match="cursor"):
            ds.load_state_dict(bad)


def test_a_cursor_at_the_end_of_its_stream_starts_the_next_epoch(packed_lakes):
    ds = PackedIterableDataset(packed_lakes["text"], batch_size=4, seed=1)
    ds.load_state_dict({**ds.state_dict(), "consumed": ds.stream_len})
    assert _counts(ds.state_dict()) == {"epoch": 1, "seed": 1, "consumed": 0} and len(ds) == ds.stream_len


def test_drop_last_ends_the_epoch_at_its_last_whole_batch_and_a_partial_batch_left_is_warned(packed_lakes):
    rows = len(PackedIterableDataset(packed_lakes["text"], batch_size=1).rows)
    batch = next(b for b in range(3, rows) if rows % b)  # a batch size that leaves a partial batch
    ds = PackedIterableDataset(packed_lakes["text"], batch_size=batch, drop_last=True)
    loader = DataLoader(ds, batch_size=batch, drop_last=True, collate_fn=collate_packed)
    for epoch in range(2):
        seen = []
        for b in loader:
            seen += b["row_index"].tolist()
            ds.advance(b)
        assert len(seen) == rows - rows % batch and _counts(ds.state_dict())["epoch"] == epoch + 1
    resumed = PackedIterableDataset(packed_lakes["text"], batch_size=2 * batch, drop_last=True)  # another size
    resumed.load_state_dict({**ds.state_dict(), "consumed": batch})
    taken = []
    for b in DataLoader(resumed, batch_size=2 * batch, drop_last=True, collate_fn=collate_packed):
        taken += b["row_index"].tolist()
        resumed.advance(b)
    assert len(taken) == (rows - batch) // (2 * batch) * 2 * batch and _counts(resumed.state_dict())["epoch"] == 3
    with pytest.raises(ValueError, match="holds no whole batch"):
        PackedIterableDataset(packed_lakes["text"], batch_size=rows + 1, drop_last=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a split smaller than a batch, read whole each epoch: no warning
        small = PackedIterableDataset(packed_lakes["text"], batch_size=rows + 1)
        assert len(list(DataLoader(small, batch_size=rows + 1, collate_fn=collate_packed))) == 1
    kept = PackedIterableDataset(packed_lakes["text"], batch_size=batch)  # the DataLoader drops; the dataset not
    kept.load_state_dict({**kept.state_dict(), "consumed": rows - rows % batch})
    with pytest.warns(UserWarning, match="less than a batch: a DataLoader with drop_last=True never yields them"):
        assert list(DataLoader(kept, batch_size=batch, drop_last=True, collate_fn=collate_packed)) == []


def test_a_shard_rewritten_during_training_is_refused_unless_its_bytes_are_the_same(lake_copy: Path):
    ds = PackedDataset(lake_copy)
    epoch = PackedIterableDataset(lake_copy, batch_size=len(ds))
    shard = ds.rows.files[0].path
    same = shard.with_name("same.tmp")
    shutil.copyfile(shard, same)
    same.replace(shard)  # a rerun's publication: another file, the same bytes
    assert ds[0]["row_index"] == 0
    epoch.advance(len(ds))  # an epoch ends: its process takes the new file, so the next workers hash nothing again
    st = shard.stat()
    assert epoch.rows._seen[0] == (st.st_size, st.st_mtime_ns, st.st_ino)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    changed = shard.with_name("changed.tmp")
    changed.write_bytes(bytes(data))
    changed.replace(shard)  # a rebuild with other bytes, after the dataset verified the old ones
    ds.rows._cache.clear()  # as a new epoch's workers start: no row group of the old file decoded
    with pytest.raises(ShardIntegrityError, match="changed since this split was read .*sha256 differs"):
        ds[0]
    with pytest.raises(ShardIntegrityError, match="changed since this split was read"):
        epoch.advance(len(ds))  # the next epoch's end checks the files too
