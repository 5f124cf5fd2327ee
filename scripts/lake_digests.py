"""Print the sha256 of every lake file a full run of a data dir writes: the evidence that a change of structure
changed no output byte. Run it before and after a change and compare the two files.

    .venv/bin/python scripts/lake_digests.py [--data-dir data] [--shared] > before.txt

It copies the data dir's specs, mixes, drops, corpus and templates to a temporary folder, runs `prep-assets run`
there with a fresh DAGSTER_HOME and prints `<sha256>  <path under lake/>`, one line per file, sorted; it exits
with the run's exit code (non-zero: a gate failed or a dataset is in error, and the digests are not evidence).
With `--shared`, the real datasets and tokenizers the tests read from ../shared are run too (as extra datasets).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
SHARED = PROJECT.parent / "shared"

# Real datasets from ../shared, each with the spec the tests use for it.
SHARED_SPECS = {
    "shared_gsm8k": (
        "datasets/instruction/gsm8k_train.jsonl",
        "input: {type: instruction, prompt_key: question, completion_key: answer}\n"
        "tokenizer: {path: TOK}\nsequence: {max_seq_len: 1024}\n",
    ),
    "shared_alpaca": (
        "datasets/instruction/alpaca_en_demo.json",
        "input: {type: instruction, prompt_key: [instruction, input], completion_key: output}\n"
        "tokenizer: {path: TOK}\nsequence: {max_seq_len: 1024}\n",
    ),
    "shared_glaive": (
        "datasets/chat/glaive_toolcall_en_demo.json",
        "input: {type: chat}\ntokenizer: {path: TOK, chat_template_file: templates/chatml.jinja}\n"
        "sequence: {max_seq_len: 2048}\nchecks: {max_gold_reject_rate: 1.0}\n",
    ),
    "shared_hh": (
        "datasets/preference/hh_rlhf_harmless_base_test.jsonl.gz",
        "input: {type: preference}\ntokenizer: {path: TOK, chat_template_file: templates/chatml.jinja}\n"
        "sequence: {max_seq_len: 2048, overflow: truncate_left}\n"
        "checks: {max_gold_reject_rate: 1.0, max_reject_rate: 1.0}\n",
    ),
    "shared_dow": (
        "datasets/tabular/dow_jones_index_group_size_8.csv",
        "input: {type: tabular}\ntabular: {group_by: stock}\ntokenizer: {path: TOK}\nsequence: {max_seq_len: 2048}\n",
    ),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=str(PROJECT / "data"))
    parser.add_argument("--shared", action="store_true", help="also run real datasets from ../shared")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lake_digests_") as tmp:
        data = Path(tmp) / "data"
        for sub in ("datasets", "mixes", "raw", "corpus", "templates"):
            if (Path(args.data_dir) / sub).is_dir():
                shutil.copytree(Path(args.data_dir) / sub, data / sub)
        if args.shared:
            for name, (rel, spec) in SHARED_SPECS.items():
                if not (SHARED / rel).is_file():
                    continue
                (data / "raw" / name).mkdir(parents=True)
                shutil.copyfile(SHARED / rel, data / "raw" / name / Path(rel).name)
                text = spec.replace("TOK", str(SHARED / "tokenizers" / "gpt2"))
                (data / "datasets" / f"{name}.yaml").write_text(text, encoding="utf-8")
        env = {**os.environ, "DAGSTER_HOME": str(Path(tmp) / "home")}
        env.pop("PREP_ASSETS_DATA_DIR", None)
        done = subprocess.run(
            [sys.executable, "-m", "prep_assets.cli", "run", "--data-dir", str(data)],
            env=env,
            capture_output=True,
            text=True,
        )
        print(done.stdout, file=sys.stderr)
        if done.returncode != 0:
            print(done.stderr, file=sys.stderr)
        lake = data / "lake"
        for path in sorted(p for p in lake.rglob("*") if p.is_file() and not p.name.endswith(".lock")):
            print(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.relative_to(lake)}")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
