"""What the two databases Hearth runs on (SQLite, PostgreSQL) do differently,
in the few places the code depends on it.

- `serialize(name)`: a check-then-insert inside `transaction.atomic()` must
  not interleave with another process's. SQLite write transactions already
  run one at a time (they begin IMMEDIATE, config/settings.py); PostgreSQL
  takes a transaction-scoped advisory lock on the name.
- `nul_safe_text()`: PostgreSQL text cannot hold NUL (U+0000), which SQLite
  stores and which a model's output or an imported chat may carry; on
  PostgreSQL every string parameter has its NULs replaced by U+FFFD, so such
  a turn is stored (visibly marked) instead of failing.

Uses Django's connection; no imports of the project's apps."""
from __future__ import annotations

from django.db import connection

NUL_REPLACEMENT = "\ufffd"


def serialize(name: str) -> None:
    """Inside `transaction.atomic()`: hold the lock called `name` until the
    transaction ends."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [name])


def nul_safe_text() -> None:
    """Register psycopg's string dumpers that replace NUL, for every connection
    opened afterwards (the server refuses a string holding one)."""
    import psycopg
    from psycopg.types.string import StrBinaryDumper, StrDumperUnknown

    class NulSafeText(StrDumperUnknown):
        def dump(self, obj: str):
            return super().dump(obj.replace("\x00", NUL_REPLACEMENT) if "\x00" in obj else obj)

    class NulSafeBinaryText(StrBinaryDumper):
        def dump(self, obj: str):
            return super().dump(obj.replace("\x00", NUL_REPLACEMENT) if "\x00" in obj else obj)

    psycopg.adapters.register_dumper(str, NulSafeBinaryText)
    psycopg.adapters.register_dumper(str, NulSafeText)  # last: the text one stays the default, as in psycopg
