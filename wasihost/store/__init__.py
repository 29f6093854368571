"""State on disk: the state directory, its SQLite database, key-value rows and secrets."""
