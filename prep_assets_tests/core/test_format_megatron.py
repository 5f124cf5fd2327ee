"""The `megatron` output format on instruction and chat gold: real shards of the shipped samples built in core,
the .bin/.idx read back with a reader of Megatron-LM's published MMIDIDX layout, document by document."""

from __future__ import annotations

from pathlib import Path

import pytest

from prep_assets.core.errors import SpecError
from prep_assets_tests.conftest import copy_sample_data
from prep_assets_tests.core.helpers import gold_documents, read_mmidx, run_core, sample_spec


@pytest.mark.parametrize("name", ["sample_instruct", "sample_chat"])
def test_megatron_documents_equal_gold_token_ids_in_order(tmp_path: Path, name: str):
    copy_sample_data(tmp_path)
    spec = sample_spec(tmp_path, name, output={"formats": ["parquet", "megatron"]})
    documents = 0
    for result in run_core(tmp_path, spec).values():
        shards, gold = result["dirs"][3], gold_documents(result["dirs"][2])
        for split, docs in gold.items():
            m = read_mmidx(shards / split / "megatron" / "text_document")
            assert m["version"] == 1 and m["code"] == 8 and m["rest"] == 0  # a 1,024-id vocabulary: uint16
            assert m["sizes"].tolist() == [len(d) for d in docs]
            assert m["doc_idx"].tolist() == list(range(len(docs) + 1))
            got = [
                m["data"][p // m["itemsize"] : p // m["itemsize"] + n].tolist()
                for p, n in zip(m["pointers"], m["sizes"])
            ]
            assert got == docs  # prompt and completion together, every turn, in gold order
            assert len(m["data"]) == sum(map(len, docs))
            documents += len(docs)
    assert documents >= 20


@pytest.mark.parametrize(("name", "why"), [("sample_pref", "preference pairs"), ("sample_sensors", "tabular")])
def test_megatron_refuses_pairs_and_tables_at_load(tmp_path: Path, name: str, why: str):
    copy_sample_data(tmp_path)
    with pytest.raises(SpecError, match=rf"output\.formats megatron: .*{why}"):
        sample_spec(tmp_path, name, output={"formats": ["parquet", "megatron"]})
