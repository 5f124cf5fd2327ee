"""`astrai_bin`: a split's gold examples in AstrAI's memory-mapped `bin` storage, one folder per domain.

Per split, `<split>/astrai/<domain>/shard_NNNN/` holds `sequence.bin` and `loss_mask.bin` (int64, little-endian:
the domain's examples concatenated in gold order) and `meta.json`, per key `{"shape": [tokens], "dtype":
"int64", "offsets": [0, ...]}`: the example boundaries AstrAI's `MmapStore` reads for record access (its stream
access ignores them). A shard holds at most `output.max_tokens_per_shard` tokens; an example longer than that is
a shard of its own. The domain is the record's `input.domain_key` value (AstrAI's `output.domain_key`); records
naming none go to `__default__`, as in AstrAI. A domain that is not a plain file name (`[A-Za-z0-9._-]`, not `.`
or `..`) gets the folder `domain-<sha256 prefix>`; the manifest entry maps every domain to its folder.
AstrAI's loader finds every `meta.json` below the folder it is given, so a trainer points it at a domain's folder
(or at `astrai/` for all domains).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from prep_assets.core.exports import file_entry
from prep_assets.core.record_types import record_type
from prep_assets.core.records import DEFAULT_DOMAIN

if TYPE_CHECKING:
    from prep_assets.core.formats import Documents, SplitTarget
    from prep_assets.core.spec import DatasetSpec

ASTRAI_DIR, META = "astrai", "meta.json"
KEYS = ("sequence", "loss_mask")
_READ_TOKENS = 1 << 22  # tokens gathered from the spill at a time (memory stays bounded by this)
_PLAIN = re.compile(r"[A-Za-z0-9._-]+")


def folder_of(domain: str) -> str:
    if _PLAIN.fullmatch(domain) and domain not in (".", ".."):
        return domain
    return "domain-" + hashlib.sha256(domain.encode("utf-8")).hexdigest()[:16]


def shard_bounds(lengths: np.ndarray, cap: int) -> list[tuple[int, int]]:
    """Consecutive example ranges of at most `cap` tokens each (a longer example alone)."""
    ends = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    out, lo = [], 0
    while lo < len(lengths):
        hi = max(int(np.searchsorted(ends, ends[lo] + cap, side="right")) - 1, lo + 1)
        out.append((lo, hi))
        lo = hi
    return out


def _write_shard(docs: Documents, examples: np.ndarray, dest: Path) -> None:
    dest.mkdir(parents=True)
    lengths = docs.lengths[examples]
    with (dest / "sequence.bin").open("wb") as seq, (dest / "loss_mask.bin").open("wb") as mask:
        for lo, hi in shard_bounds(lengths, _READ_TOKENS):  # gathered a bounded batch of examples at a time
            ids, loss, _ = docs.gather(examples[lo:hi])
            ids.astype("<i8").tofile(seq)
            loss.astype("<i8").tofile(mask)
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).tolist()
    entry = {"shape": [offsets[-1]], "dtype": "int64", "offsets": offsets}
    (dest / META).write_text(json.dumps({k: entry for k in KEYS}, separators=(",", ":")), encoding="utf-8")


def write(target: SplitTarget, docs: Documents) -> dict[str, Any]:
    """The split's examples by domain, in AstrAI's shards; the manifest entry lists every file."""
    domains = np.array([d if d is not None else DEFAULT_DOMAIN for d in docs.domains], dtype=object)
    root, rel = target.dir / ASTRAI_DIR, f"{target.rel}/{ASTRAI_DIR}"
    files, folders, tokens = [], {}, {}
    for domain in sorted(set(domains.tolist())):
        examples = np.flatnonzero(domains == domain)
        folders[domain], tokens[domain] = folder_of(domain), int(docs.lengths[examples].sum())
        for n, (lo, hi) in enumerate(shard_bounds(docs.lengths[examples], target.max_tokens_per_file)):
            shard = f"{folders[domain]}/shard_{n:04d}"
            _write_shard(docs, examples[lo:hi], root / shard)
            files += [
                file_entry(root / shard / name, f"{rel}/{shard}/{name}")
                for name in ("sequence.bin", "loss_mask.bin", META)
            ]
    return {"dir": rel, "domains": folders, "tokens_by_domain": tokens, "files": files}


def refuses(spec: DatasetSpec) -> str | None:
    kind = record_type(spec.input.type)
    if kind.paired:
        return "AstrAI's bin storage holds one sequence per record; a chosen/rejected pair has no layout there"
    if kind.table_rows:
        return (
            "tabular examples are assembled from many records; AstrAI's bin storage is for text, instruction and chat"
        )
    return None
