"""Error classes by scope (dolma style): what a failure stops, and what it tells the user to do."""


class PrepAssetsError(Exception):
    """An error a user can act on; its message is printed without a traceback."""


class SpecError(PrepAssetsError):
    """A dataset spec is invalid: nothing of that dataset can run until it is fixed."""


class DropError(PrepAssetsError):
    """One drop (partition) cannot be processed; other drops go on."""


class TokenizerError(PrepAssetsError):
    """The tokenizer cannot be resolved, loaded or trained."""


class WriteError(DropError):
    """An output could not be written (a full disk, a read-only lake); the previous output is kept."""


class ManifestError(PrepAssetsError):
    """A manifest that would name files whose bytes differ from their recorded checksums: not published."""


class ReadError(PrepAssetsError):
    """A manifest's shards cannot be read for training as recorded: nothing is yielded until it is fixed."""


class ShardIntegrityError(ReadError):
    """A shard file a manifest names is missing or its bytes differ from the recorded sha256."""


class SplitNotFoundError(ReadError):
    """The split asked for is not in the manifest (or holds no shard file)."""


class ManifestMismatchError(ReadError):
    """Manifests read together disagree on the tokenizer fingerprint or max_seq_len."""
