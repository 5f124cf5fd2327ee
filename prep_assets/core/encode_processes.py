"""tiktoken in worker processes: each worker encodes a stripe of a batch's texts with its own interpreter, so every
core encodes at once.

Threads cannot do this for short texts: a tiktoken call needs the GIL to read its text and to build its list of
ids, and with texts of a few hundred characters two threads hand the GIL back and forth more than they encode
(measured on the benchmark's texts: 2 threads no faster than 1; 10 texts per call, 1.8x). A worker is
`python -m prep_assets.core.encode_worker`, fed through its stdin and read through its stdout; only bytes and
integers cross (no pickle), all integers little-endian:

- once, at start: u64 length + the tokenizer's JSON, u64 length + the split pattern (both UTF-8): the worker builds
  the same tiktoken encoding as `fast_bpe.build_encoding` in this process;
- per request: u64 n, n x u64 byte lengths, then the n texts' UTF-8 bytes;
- per response, in request order: n x u64 token counts, then the ids as int32.

A worker reads a whole request before it answers, and each worker has a writer and a reader thread here, so the next
request is on its way while the worker encodes the current one (a worker never waits for this process). Its ids are
tiktoken's `encode_ordinary` of the same text: the engine, not the output, changes; `FastEncoder` still re-encodes a
seeded sample of every batch with HF. A worker that dies fails the batch with its exit code and last error lines.
"""

from __future__ import annotations

import os
import queue
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import IO, Any

import numpy as np

from prep_assets.core.errors import DropError

try:
    import fcntl
except ImportError:  # not on Windows
    fcntl = None  # type: ignore[assignment]

PROCESSES_ENV = "PREP_ASSETS_ENCODE_PROCESSES"
# a batch below this many characters is encoded in this process: a worker's start (~0.2 s) and a round trip would
# cost more than they save, and small drops (tests, the sample data) never start one
MIN_CHARS = 1 << 20

U64 = struct.Struct("<Q")  # the protocol's integers: little-endian u64


def processes_setting() -> int:
    """PREP_ASSETS_ENCODE_PROCESSES: worker processes for tiktoken (default: the machine's cores; below 2, none)."""
    raw = os.environ.get(PROCESSES_ENV, "").strip()
    if not raw:
        return os.cpu_count() or 1
    try:
        value = int(raw)
    except ValueError:
        raise DropError(f"{PROCESSES_ENV}={raw!r}: expected a whole number of processes (0: none)") from None
    return max(value, 0)


def frame(*parts: bytes) -> bytes:
    """Each part as u64 length + bytes."""
    return b"".join(U64.pack(len(p)) + p for p in parts)


def request(texts: list[bytes]) -> bytes:
    lengths = np.fromiter(map(len, texts), dtype="<u8", count=len(texts))
    return U64.pack(len(texts)) + lengths.tobytes() + b"".join(texts)


def read_exactly(stream: IO[bytes], n: int) -> bytes:
    """`n` bytes, or EOFError if the stream ends first."""
    data = stream.read(n)
    if len(data) != n:
        raise EOFError(f"the stream ended after {len(data)} of {n} bytes")
    return data


# Linux's largest pipe buffer for unprivileged processes (/proc/sys/fs/pipe-max-size)
PIPE_BYTES = 1 << 20


def _widen(pipe: IO[bytes] | None) -> None:
    """A pipe of PIPE_BYTES where the system allows (Linux): with 64 KB, every chunk of a megabyte request makes the
    writing thread take the GIL back, waiting behind the others each time."""
    setsize = getattr(fcntl, "F_SETPIPE_SZ", None) if fcntl is not None else None
    if pipe is None or setsize is None:
        return
    try:
        fcntl.fcntl(pipe.fileno(), setsize, PIPE_BYTES)
    except OSError:
        pass


class _Worker:
    """One worker process, its writer thread (requests out, in order) and its reader thread (responses in)."""

    def __init__(self, init: bytes) -> None:
        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "prep_assets.core.encode_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
        )
        for pipe in (self.proc.stdin, self.proc.stdout):  # a request or answer in a few writes, not 64 KB ones
            _widen(pipe)
        self._out: queue.SimpleQueue[tuple[bytes, tuple[int, Future[Any]] | None] | None] = queue.SimpleQueue()
        self._inflight: queue.SimpleQueue[tuple[int, Future[Any]] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._stopped = False  # the writer has ended: a request now fails at once
        self._out.put((init, None))
        self._writer = threading.Thread(target=self._write, name="encode-writer", daemon=True)
        self._reader = threading.Thread(target=self._read, name="encode-reader", daemon=True)
        self._writer.start()
        self._reader.start()

    def submit(self, texts: list[bytes]) -> Future[tuple[np.ndarray, np.ndarray]]:
        """The texts' (token counts, ids), when the worker has answered."""
        done: Future[tuple[np.ndarray, np.ndarray]] = Future()
        payload = request(texts)
        with self._lock:
            if not self._stopped:
                self._out.put((payload, (len(texts), done)))
                return done
        done.set_exception(self._died(BrokenPipeError("the worker takes no more requests")))
        return done

    def _write(self) -> None:
        stdin = self.proc.stdin
        assert stdin is not None
        try:
            while (item := self._out.get()) is not None:
                payload, pending = item
                if pending is not None:
                    self._inflight.put(pending)
                stdin.write(payload)
                stdin.flush()
        except OSError:  # the worker is gone: the reader reports it
            pass
        finally:
            with self._lock:  # requests sent or queued go to the reader, which answers them or fails them
                self._stopped = True
                while not self._out.empty():
                    item = self._out.get()
                    if item is not None and item[1] is not None:
                        self._inflight.put(item[1])
            self._inflight.put(None)
            try:
                stdin.close()
            except OSError:
                pass

    def _read(self) -> None:
        stdout = self.proc.stdout
        assert stdout is not None
        failure: BaseException | None = None
        while (pending := self._inflight.get()) is not None:
            n, done = pending
            if failure is None:
                try:
                    counts = np.frombuffer(read_exactly(stdout, 8 * n), dtype="<u8").astype(np.int64)
                    ids = np.frombuffer(read_exactly(stdout, 4 * int(counts.sum())), dtype="<i4")
                except (EOFError, OSError) as exc:
                    failure = self._died(exc)
                else:
                    done.set_result((counts, ids))
                    continue
            done.set_exception(failure)

    def _died(self, exc: BaseException) -> DropError:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        self._stderr.seek(0)
        tail = self._stderr.read()[-2000:].decode("utf-8", "replace").strip()
        return DropError(
            f"a tiktoken worker process ended before answering (exit code {code}; {exc}): "
            f"{tail or 'it wrote no error'}; set {PROCESSES_ENV}=0 to encode in this process"
        )

    def close(self) -> None:
        """Stop taking requests, let the worker finish the ones sent, and end it (killed if it does not end)."""
        self._out.put(None)
        self._writer.join()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()


class EncodeProcesses:
    """`count` workers started together; `encode` deals a batch's texts to them in interleaved stripes."""

    def __init__(self, tokenizer_json: str, pattern: str, count: int) -> None:
        init = frame(tokenizer_json.encode("utf-8"), pattern.encode("utf-8"))
        self._workers: list[_Worker] = []
        try:
            for _ in range(count):
                self._workers.append(_Worker(init))
        except BaseException:
            self.close()
            raise

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """Each text's ids (int32 arrays, in order): `submit`, then wait for the answers."""
        return self.submit(texts)()

    def submit(self, texts: list[str]) -> Callable[[], list[np.ndarray]]:
        """Send the texts to the workers and return what waits for their ids (int32 arrays, in order); a batch
        sent while the workers encode the one before is queued in their pipes, so they never wait between batches.
        UnicodeEncodeError if a text is not valid UTF-8 (a lone surrogate), before anything is sent. Each worker
        takes a run of texts holding an equal share of the bytes (interleaved texts would give one worker every
        prompt and the other every completion)."""
        raw = [t.encode("utf-8") for t in texts]
        ends = np.cumsum(np.fromiter(map(len, raw), dtype=np.int64, count=len(raw)))
        total, k = (int(ends[-1]) if len(raw) else 0), len(self._workers)
        cuts = [0, *np.searchsorted(ends, [total * i // k for i in range(1, k)]).tolist(), len(raw)]
        answers = [w.submit(raw[a:b]) for w, a, b in zip(self._workers, cuts[:-1], cuts[1:], strict=True)]

        def ids() -> list[np.ndarray]:
            out: list[np.ndarray] = []
            for answer in answers:
                counts, ids = answer.result()
                out += np.split(ids, np.cumsum(counts)[:-1]) if len(counts) else []
            return out

        return ids

    def close(self) -> None:
        for w in self._workers:
            w.close()
        self._workers = []
