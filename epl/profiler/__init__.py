"""Profiling a training step: measured memory per device
(`epl.profiler.memory_profiler_hook`), estimated memory per device before
it runs (`epl.profiler.memory_estimate`); FLOPs profiling is not built yet
(`epl.profiler.flops`)."""
