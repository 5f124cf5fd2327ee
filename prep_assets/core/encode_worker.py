"""A tiktoken worker process (`encode_processes`): reads the tokenizer once, then answers requests until its stdin
ends. Run as `python -m prep_assets.core.encode_worker`; the protocol is in `encode_processes`."""

from __future__ import annotations

import json
import sys
from typing import IO

import numpy as np

from prep_assets.core.encode_processes import U64, read_exactly
from prep_assets.core.fast_bpe import build_encoding


def _part(stream: IO[bytes]) -> bytes:
    (n,) = U64.unpack(read_exactly(stream, 8))
    return read_exactly(stream, n)


def serve(stdin: IO[bytes], stdout: IO[bytes]) -> None:
    tokenizer_json, pattern = _part(stdin), _part(stdin).decode("utf-8")
    encode = build_encoding(json.loads(tokenizer_json), pattern).encode_ordinary
    while head := stdin.read(8):
        if len(head) != 8:
            raise EOFError("a request ended inside its header")
        (n,) = U64.unpack(head)
        lengths = np.frombuffer(read_exactly(stdin, 8 * n), dtype="<u8").astype(np.int64)
        payload = read_exactly(stdin, int(lengths.sum()))
        ends = np.cumsum(lengths).tolist()
        starts = [0, *ends[:-1]] if ends else []
        # each text's ids as int32 at once: the Python lists of a whole request held ~35 MiB more at the benchmark's
        # batch size (36 bytes a token against 4)
        ids = [np.array(encode(payload[a:b].decode("utf-8")), dtype="<i4") for a, b in zip(starts, ends, strict=True)]
        counts = np.fromiter(map(len, ids), dtype="<u8", count=n)
        stdout.write(counts.tobytes())
        stdout.write(np.concatenate(ids, dtype="<i4") if ids else b"")  # little-endian whatever the host
        stdout.flush()


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)
