"""Static analysis of graphs: FLOPs and bytes, the memory estimate of a
plan, the search for gradient checkpoints."""
