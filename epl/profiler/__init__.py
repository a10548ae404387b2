"""Profiling a training step: measured memory per device
(`epl.profiler.memory_profiler_hook`); static FLOPs, tensor and parameter
bytes per op and TaskGraph, and the FLOPs hook (`epl.profiler.flops`)."""
