"""Static guards over the package source: no pickle, no remote code, no SQL built from data, no open host."""

import ast
import re
from pathlib import Path

from prep_assets.cli import build_parser
from prep_assets_tests.conftest import PROJECT

PACKAGE = PROJECT / "prep_assets"
SOURCES = sorted(PACKAGE.rglob("*.py"))
SQL_WORDS = re.compile(r"\b(SELECT|FROM|WHERE|JOIN|GROUP BY|ORDER BY|read_parquet|read_csv|COPY|INSERT|CREATE)\b")
# Names an f-string SQL may interpolate: fixed query fragments written in the code (constants, or locals
# assembled from literals in the same function). Paths, partition keys, values and column names from data are
# never among them: they are bound as $parameters. A new name here must be such a fragment.
SQL_FRAGMENTS = {
    "_SPLIT_HASHED",
    "_SPLIT_SHARE",
    "_MOD_2_64",
    "_FIXED_BROKEN",
    "_LAYOUT_DIFFERS",
    "_ROW_HASH",
    "_EXPECTED",
    "pieces",
    "flags",
    "broken_any",
    "_ROWS_NAMED",
    "_GOLD_ROW_SUMS",
    "_SEG_AT",
    "_LOCATION",
    "_SEGMENTS",
    "_SPLIT_OF_FILE",
    "_TOKENS_OF_NAMED",
    "_PAD_SUSPECT",
    "inner",
    "_ROWS",
    "_HASHES",
    "short_layout",
    "long_layout",
    "_PADDING_TAILS",
    "_SEGMENTS_WITH_SLICES",
    "hashes",
    "segments",
    "gaps",
    "columns",
    "ids",
    "kept_ids",
    "kept_where",
    "order",
    "rows",
    "source",
    "sql",
    "w",
    "where",
}


def _code(path: Path) -> str:
    """The source without comments and docstrings (they may name what is forbidden, to forbid it)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
        ):
            body[0] = ast.Pass()
    return ast.unparse(tree)


def test_no_pickle_no_remote_code_no_unsandboxed_templates():
    offenders = []
    for path in SOURCES:
        code = _code(path)
        for pattern in (
            r"\bimport pickle\b|\bpickle\.",
            r"trust_remote_code\s*=\s*True",
            r"allow_pickle\s*=\s*True",
            r"\bcloudpickle\b|\bdill\b|\bjoblib\b",
            r"torch\.load\(",
            # chat templates render only through transformers' sandboxed Jinja environment
            r"\bimport jinja2\b|\bfrom jinja2\b|\beval\(|\bexec\(",
        ):
            if re.search(pattern, code):
                offenders.append(f"{path.relative_to(PROJECT)}: {pattern}")
    assert not offenders, offenders


def test_np_load_always_refuses_pickles():
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("np.load", "numpy.load"):
                kwargs = {k.arg: ast.unparse(k.value) for k in node.keywords}
                assert kwargs.get("allow_pickle") == "False", (
                    f"{path}:{node.lineno}: np.load without allow_pickle=False"
                )


def test_sql_f_strings_interpolate_only_fixed_fragments():
    found, offenders = set(), []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.JoinedStr):
                continue
            literal = "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
            if not SQL_WORDS.search(literal):
                continue
            for value in node.values:
                if isinstance(value, ast.FormattedValue):
                    name = ast.unparse(value.value)
                    found.add(name)
                    if name not in SQL_FRAGMENTS:
                        offenders.append(f"{path.relative_to(PROJECT)}:{node.lineno}: {{{name}}}")
    assert found, "the scan found no SQL f-string at all: the pattern is broken"
    assert not offenders, f"SQL built from something other than a fixed fragment (bind it as $param): {offenders}"


def test_sql_never_names_a_file_inline():
    pattern = re.compile(r"read_(parquet|csv|json)\(\s*['\"]")
    offenders = [str(p.relative_to(PROJECT)) for p in SOURCES if pattern.search(_code(p))]
    assert not offenders, f"file paths must be bound parameters: {offenders}"


def test_no_open_host_by_default():
    files = [*SOURCES, PROJECT / "workspace.yaml", PROJECT / "dagster.yaml", PROJECT / ".ci" / "run"]
    offenders = [str(p.relative_to(PROJECT)) for p in files if "0.0.0.0" in _text(p)]
    assert not offenders, offenders
    readme = (PROJECT / "README.md").read_text(encoding="utf-8")
    assert "prep-assets ui" in readme and "0.0.0.0" not in readme
    ui = build_parser().parse_args(["ui"])  # the README's UI command binds to localhost unless told otherwise
    assert ui.host == "127.0.0.1"


def _text(path: Path) -> str:
    return _code(path) if path.suffix == ".py" else path.read_text(encoding="utf-8")
