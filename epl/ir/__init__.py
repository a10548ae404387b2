"""EPL's intermediate representation: TaskGraphs, phases and per-graph capture state.

`epl.ir.phase` (the original's `ModelPhase`) is loaded with the package.
"""
from epl.ir import phase  # noqa: F401
