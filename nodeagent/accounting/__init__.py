"""The accounting database (docs/accounting.md): every ended job's record, kept beyond the
pool's window (pool.keep_ended) for `history` and `report`, in PostgreSQL (a cluster) or a
SQLite file (one host). ledger.py: its one table and the queries; databases.py: `open_ledger`, the
database a config names, opened."""
