"""The ``quorumlog.table`` data source's pure rules, without a Spark session:
options, write columns, and how filters narrow the scan."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (the spark extra)")
pytest.importorskip("pyarrow", reason="pyarrow is not installed (the spark extra)")

from pyspark.sql.datasource import (
    EqualTo,
    GreaterThan,
    In,
    LessThanOrEqual,
    StringStartsWith,
)

from quorumlog.errors import UsageError
from quorumlog.spark._table_source import (
    _Pushdown,
    check_table_write_schema,
    parse_table_options,
    push_filter,
)


def test_options_are_checked_with_their_names() -> None:
    parsed = parse_table_options({"meta": "127.0.0.1:1, 127.0.0.1:2", "table": "t",
                                  "pageRecords": "10"})
    assert parsed.meta == ("127.0.0.1:1", "127.0.0.1:2") and parsed.page_records == 10
    with pytest.raises(UsageError, match="option meta is required"):
        parse_table_options({"table": "t"})
    with pytest.raises(UsageError, match="option table is required"):
        parse_table_options({"meta": "a:1"})
    with pytest.raises(UsageError, match="pageRecords=0 must be"):
        parse_table_options({"meta": "a:1", "table": "t", "pageRecords": "0"})


def test_stale_ok_option() -> None:
    assert not parse_table_options({"meta": "a:1", "table": "t"}).stale_ok
    assert parse_table_options({"meta": "a:1", "table": "t", "staleOk": "True"}).stale_ok
    assert not parse_table_options({"meta": "a:1", "table": "t", "staleok": "false"}).stale_ok
    with pytest.raises(UsageError, match="staleOk='yes' must be true or false"):
        parse_table_options({"meta": "a:1", "table": "t", "staleOk": "yes"})


def test_snapshot_option_is_on_by_default() -> None:
    assert parse_table_options({"meta": "a:1", "table": "t"}).snapshot
    assert not parse_table_options({"meta": "a:1", "table": "t", "snapshot": "false"}).snapshot
    with pytest.raises(UsageError, match="snapshot='1' must be true or false"):
        parse_table_options({"meta": "a:1", "table": "t", "snapshot": "1"})


def test_write_columns() -> None:
    check_table_write_schema({"hash_key": "binary", "sort_key": "string", "value": "binary",
                              "ttl_s": "int"})
    with pytest.raises(UsageError, match="needs a 'value' column"):
        check_table_write_schema({"hash_key": "binary", "sort_key": "binary"})
    with pytest.raises(UsageError, match="column ttl_s has type string"):
        check_table_write_schema({"hash_key": "binary", "sort_key": "binary",
                                  "value": "binary", "ttl_s": "string"})


def test_hash_key_and_sort_key_filters_narrow_the_scan() -> None:
    push = _Pushdown()
    for item in (In(("hash_key",), (b"a", b"b")), EqualTo(("hash_key",), bytearray(b"b")),
                 GreaterThan(("sort_key",), b"s1"), LessThanOrEqual(("sort_key",), b"s5"),
                 GreaterThan(("sort_key",), b"s0"), StringStartsWith(("value",), "x")):
        push_filter(push, item)
    assert push.hash_keys == {b"b"}
    assert (push.start, push.start_inclusive) == (b"s1", False)
    assert (push.stop, push.stop_inclusive) == (b"s5", True)
    untouched = _Pushdown()
    push_filter(untouched, EqualTo(("value",), b"v"))
    assert untouched == _Pushdown()
