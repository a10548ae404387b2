"""What EPL records while the user builds the graph: each op's TaskGraph and
phase, gradients and updates, input file slicing, the graph-mode check."""
