"""Profiling a training step: measured memory per device
(`epl.profiler.memory_profiler_hook`), estimated memory per device before
it runs (`epl.profiler.memory_estimate`); static FLOPs, tensor and
parameter bytes per op and TaskGraph, and the FLOPs hook
(`epl.profiler.flops`)."""
