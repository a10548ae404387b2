"""The cost model of the parallel transformation: FLOPs and bytes per op,
and the search for repeated blocks (gradient checkpoints, stage cuts)."""
