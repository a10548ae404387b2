"""EPL's package layers, lowest first: the declaration that
tests/test_layers.py checks imports against and that
`python -m epl.tools.diagram` writes into docs/architecture.md.

A module imports only from its own layer or lower ones. A module belongs
to the first entry one of whose prefixes names it or a package above it
("epl" itself is the top). Plain data: this module imports nothing, so the
layering test can read it without importing EPL.
"""

# (module prefixes, role)
LAYERS = (
    (("epl.tf_compat",),
     "the boundary to TensorFlow/Keras internals (imports only TF, Keras, "
     "numpy and optional packages)"),
    (("epl.config", "epl.collections", "epl.user_warnings", "epl.layers"),
     "settings ([config.md](config.md)), merged-collection keys, warnings "
     "of wrapped TF calls pointed at the user's line, this declaration"),
    (("epl.cluster", "epl.env"),
     "workers and devices, the process-wide environment"),
    (("epl.ir",),
     "graph state, TaskGraphs, phases, graph editing (`Cloner`; the "
     "passes' only way to edit), variables by structure, EPL's op names, "
     "what a run moves between devices"),
    (("epl.strategies",), "`replicate`, `split` scopes"),
    (("epl.capture",),
     "what the TF hooks record at graph-build time; graph mode; IO slicing"),
    (("epl.parallel.cost",),
     "the parallel transformation's cost model: FLOPs and bytes per op, "
     "the repeated-block search (gradient checkpoints, stage cuts)"),
    (("epl.parallel.plan",),
     "planner, balance, auto-parallel cut, pipeline pass orders, their "
     "timing and the schedule chosen under a memory budget"),
    (("epl.communicators", "epl.parallel.ops"),
     "collective, local and Horovod communicators; split lowering, "
     "collective gradients"),
    (("epl.parallel.passes",), "one module per rewrite pass"),
    (("epl.parallel.manager", "epl.parallel.engine", "epl.parallel"),
     "the pass manager and the engine that runs the passes (the original "
     "EPL's parallel.py)"),
    (("epl.runtime",),
     "session-time only: sessions, servers (and what their network "
     "namespace exposes), checkpoints, summaries, failures, collective "
     "groups of a run, Estimator"),
    (("epl.tools",),
     "dry run (`epl-plan`) with its memory estimate and traffic against "
     "its formulas, launcher "
     "(`epl-launch`) and its private network namespace, Horovod launch, "
     "timeline, schedule simulator, the architecture diagram"),
    (("epl.hooks", "epl.api", "epl.profiler", "epl"),
     "the TF patches wired to capture/passes/runtime; the public API; the "
     "profiler facade"),
)

