"""The Host and its Extensions: the call path, policy, embedder functions and updates."""
