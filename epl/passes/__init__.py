"""The rewrite: the passes that turn the captured single-replica graph into
the distributed one, and the engine that runs them in order."""
