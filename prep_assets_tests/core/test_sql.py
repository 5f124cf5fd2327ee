"""DuckDB connections: a database each, or, inside `shared_database`, cursors of one (what a gate step uses)."""

import duckdb
import pytest

from prep_assets.core import gates, sql
from prep_assets_tests.core.lakes import BY_ROWS


def _tables(con) -> list[str]:
    return [r[0] for r in con.sql("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall()]


def test_connections_outside_a_shared_database_see_nothing_of_each_other():
    with sql.connect() as a, sql.connect() as b:
        a.execute("CREATE TABLE t AS SELECT 1 AS x")
        assert _tables(a) == ["t"] and _tables(b) == []


def test_cursors_of_a_shared_database_share_tables_but_not_temp_tables_or_registrations():
    with sql.shared_database():
        with sql.connect() as a:
            a.execute("CREATE TABLE kept AS SELECT 1 AS x")
            a.execute("CREATE TEMP TABLE mine AS SELECT 2 AS x")
            a.register("registered", a.sql("SELECT 3 AS x").to_arrow_table())
        with sql.connect() as b:  # a's own objects went with a; the database's table is still there
            assert _tables(b) == ["kept"]
            with pytest.raises(Exception, match="registered"):
                b.sql("SELECT * FROM registered").fetchall()
            b.execute("CREATE TEMP TABLE mine AS SELECT 4 AS x")  # the same temp name again: no clash
    with sql.connect() as c:  # after the block: a new database again
        assert _tables(c) == []


def test_shared_database_is_closed_and_forgotten_even_when_the_block_raises():
    with pytest.raises(RuntimeError, match="gate broke"), sql.shared_database():
        shared = sql._SHARED.get()
        with sql.connect() as a:
            a.execute("CREATE TABLE t AS SELECT 1 AS x")
        raise RuntimeError("gate broke")
    assert shared is not None and sql._SHARED.get() is None
    with pytest.raises(duckdb.ConnectionException):
        shared.execute("SELECT 1")
    with sql.connect() as b:
        assert _tables(b) == []


def _text(outcome: object) -> object:
    return f"{type(outcome).__name__}: {outcome}" if isinstance(outcome, Exception) else outcome


def _alone(gate: gates.Gate, spec, paths) -> object:
    try:
        return gate.probe(spec, paths, "k")  # outside `outcomes`: a database of its own
    except Exception as exc:  # noqa: BLE001  (here padding_masked finds no pinned tokenizer)
        return _text(exc)


def test_gates_run_together_give_the_same_outcomes_in_one_database_as_each_in_its_own(lake):
    spec, paths, _ = lake
    chosen = [g for g in gates.gates_for(spec) if g.layer == "shards"]
    shared = [(g.name, _text(o)) for g, o in gates.outcomes(spec, paths, "k", chosen)]
    assert shared == [(g.name, _alone(g, spec, paths)) for g in chosen]
    assert set(BY_ROWS) <= {n for n, o in shared if not isinstance(o, str) and not o.passed}  # type: ignore[union-attr]


def _disabled(con) -> str:
    return con.execute("SELECT current_setting('disabled_optimizers')").fetchall()[0][0]


def test_joins_as_written_is_put_back_for_the_other_cursors_even_when_the_query_raises():
    with sql.shared_database():
        with sql.connect() as a:
            with pytest.raises(duckdb.Error), sql.joins_as_written(a):
                assert set(_disabled(a).split(",")) == set(sql.AS_WRITTEN.split(","))
                a.execute("SELECT * FROM no_such_table")
            assert _disabled(a) == ""
        with sql.connect() as b:
            assert _disabled(b) == ""
