"""Profiling a training step: measured memory per device
(`epl.profiler.memory_profiler_hook`); FLOPs profiling is not built yet
(`epl.profiler.flops`)."""
