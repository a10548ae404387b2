"""Profiling a training step, under the original EPL's names.

- `epl.profiler.memory_profiler_hook`: measured memory per device
  (`MemoryProfilerHook`, `profile_memory`).
- `epl.profiler.memory_estimate`: estimated memory per device before the
  step runs.
- `epl.profiler.flops`: static FLOPs, tensor and parameter bytes per op and
  TaskGraph, and the FLOPs hook (`FlopsProfilerHook`).
- `epl.profiler.profiler`: FLOPs and bytes of every op of the default graph
  (`profile_flops`, `profile_memory`), the original's names.

The modules live where their layer is (`epl.parallel.cost`, `epl.tools`, `epl.runtime`); this
package only re-exports them, so that `from epl.profiler.flops import ...`
keeps working.
"""
import sys

from epl.parallel.cost import flops
from epl.tools import memory_estimate
from epl.profiler import profiler
from epl.tools import memory_profiler_hook

# `import epl.profiler.flops` finds a submodule in sys.modules once its
# package is imported: the re-exported modules answer to their old names.
for _module in (flops, memory_estimate, memory_profiler_hook):
  sys.modules[__name__ + "." + _module.__name__.rsplit(".", 1)[1]] = _module
del _module

__all__ = ["flops", "memory_estimate", "memory_profiler_hook", "profiler"]
