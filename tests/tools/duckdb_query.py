"""Run one SQL query with DuckDB (PyPI package `duckdb`, installed by `cargo xtask
setup`) and print its rows as a JSON list of lists, for the tests that check the
Parquet export with a reader of its own.

Usage: python3 duckdb_query.py QUERY
"""
import json
import sys

import duckdb


def main(query):
    rows = duckdb.sql(query).fetchall()
    json.dump([[v if isinstance(v, (str, bool, type(None))) else int(v) for v in r] for r in rows], sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
