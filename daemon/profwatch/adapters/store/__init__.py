"""The SQLite state store: tables, migrations, the offline reader, the retry queue."""
