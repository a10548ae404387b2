"""Measured memory of a training step, per device.

    from epl.tools.memory_profiler_hook import MemoryProfilerHook
    hooks = [MemoryProfilerHook(save_steps=1, max_steps=5,
                                output_dir="/tmp/memory")]

For each device of a fully traced step (`RunOptions.FULL_TRACE`):

- persistent bytes: the variables that live there across steps (model
  weights, replicas' copies, optimizer slots), from the variables the
  step ran on that device and their shapes. TensorFlow's step stats do not
  carry them: resource variables are allocated by the initializer, not by
  the step.
- step peak bytes: the high-water mark of what the step's ops allocated
  there (activations, gradients, temporaries), from the allocation records
  of the step stats, in time order.
- peak bytes: persistent + step peak, the device's high-water mark.

`profile_memory` logs one line per device and, with `visualize`, writes
`<prefix>memory.csv` (one row per device), `<prefix>memory_timeline.csv`
(live bytes after each allocation) and `<prefix>memory.png` (needs
matplotlib).
"""
import csv
import dataclasses
import logging
import os
import pickle

import numpy as np
import tensorflow as tf

from epl.tools import timeline
from epl.ir.op_types import VARIABLE_TYPES

logger = logging.getLogger("epl")

_GIB = 1024.0 ** 3


@dataclasses.dataclass
class DeviceMemory:
  """Memory of one device in one step, in bytes."""
  device: str
  persistent: int
  step_peak: int

  @property
  def peak(self):
    return self.persistent + self.step_peak


def _allocations(device_stats):
  """[(micros, bytes)] of a device's allocation records (frees negative),
  in time order."""
  return sorted((record.alloc_micros, record.alloc_bytes)
                for node in device_stats.node_stats
                for memory in node.memory
                for record in memory.allocation_records)


def _variable_bytes(op):
  shape = tf.TensorShape(op.get_attr("shape"))
  if not shape.is_fully_defined():
    return 0
  return tf.as_dtype(op.get_attr("dtype")).size * shape.num_elements()


def profile_memory(run_metadata, graph=None, prefix_name="", visualize=True,
                   output_dir=""):
  """[DeviceMemory] of the traced step in `run_metadata` (of `graph`,
  default: the default graph), one per device; logs them and, with
  `visualize`, writes CSV and PNG files named `prefix_name`... into
  `output_dir`."""
  graph = graph or tf.compat.v1.get_default_graph()
  peaks = timeline.peak_memory_per_device(run_metadata)
  persistent = {device: 0 for device in peaks}
  for device_stats in run_metadata.step_stats.dev_stats:
    for node in device_stats.node_stats:
      try:
        op = graph.get_operation_by_name(node.node_name)
      except KeyError:
        continue
      if op.type in VARIABLE_TYPES:
        persistent[device_stats.device] += _variable_bytes(op)
  result = [DeviceMemory(d, persistent[d], peaks[d])
            for d in sorted(peaks, key=timeline.device_key)]
  for memory in result:
    logger.info("Device: %s, peak memory: %.4f GB (persistent %.4f GB, "
                "step %.4f GB)", memory.device, memory.peak / _GIB,
                memory.persistent / _GIB, memory.step_peak / _GIB)
  if visualize:
    _write(run_metadata, result, os.path.join(output_dir, prefix_name))
  return result


def _write(run_metadata, result, prefix):
  with open(prefix + "memory.csv", "w", newline="") as out:
    writer = csv.writer(out)
    writer.writerow(["device", "persistent_bytes", "step_peak_bytes",
                     "peak_bytes"])
    for memory in result:
      writer.writerow([memory.device, memory.persistent, memory.step_peak,
                       memory.peak])
  persistent = {m.device: m.persistent for m in result}
  curves = {}
  with open(prefix + "memory_timeline.csv", "w", newline="") as out:
    writer = csv.writer(out)
    writer.writerow(["device", "micros", "live_bytes"])
    for device_stats in run_metadata.step_stats.dev_stats:
      records = _allocations(device_stats)
      if not records:
        continue
      start = records[0][0]
      live = persistent[device_stats.device] + np.cumsum(
          [size for _, size in records])
      curves[device_stats.device] = ([t - start for t, _ in records], live)
      writer.writerows((device_stats.device, t, int(b))
                       for t, b in zip(*curves[device_stats.device]))
  _plot(curves, prefix + "memory.png")


def _plot(curves, path):
  try:
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    from matplotlib import pyplot  # pylint: disable=import-outside-toplevel
  except ImportError:
    logger.warning("MemoryProfiler: matplotlib is missing (pip install "
                   "'epl[plot]'); %s not drawn.", path)
    return
  figure, axes = pyplot.subplots(figsize=(9, 4))
  for device, (micros, live) in sorted(curves.items()):
    axes.step(np.array(micros) / 1e3, np.array(live) / 2 ** 20,
              where="post", label=device.rsplit("/", 1)[-1])
  axes.set_xlabel("time in step (ms)")
  axes.set_ylabel("live bytes (MiB), persistent included")
  axes.legend(fontsize=8)
  figure.tight_layout()
  figure.savefig(path, dpi=100)
  pyplot.close(figure)


class MemoryProfilerHook(tf.compat.v1.train.SessionRunHook):
  """Traces every `save_steps`-th run of the session up to `max_steps`
  runs and profiles its memory per device (`profile_memory`).

  Files go to `output_dir` with the prefix `step_<n>_`; with
  `dump_metadata`, the RunMetadata is pickled to `run_metadata_<n>.bin`.
  `results[n]` holds the [DeviceMemory] of run n.
  """

  def __init__(self, save_steps=1, max_steps=5, output_dir="",
               visualize=True, dump_metadata=False):
    if save_steps < 1 or save_steps > max_steps:
      raise ValueError("MemoryProfilerHook: save_steps (%d) must be between "
                       "1 and max_steps (%d)." % (save_steps, max_steps))
    self._save_steps = save_steps
    self._max_steps = max_steps
    self._output_dir = output_dir
    self._visualize = visualize
    self._dump_metadata = dump_metadata
    self._run = 0
    self.results = {}

  def _traced(self):
    return self._run <= self._max_steps and self._run % self._save_steps == 0

  def before_run(self, run_context):
    self._run += 1
    if not self._traced():
      return None
    return tf.compat.v1.train.SessionRunArgs(
        fetches=None, options=tf.compat.v1.RunOptions(
            trace_level=tf.compat.v1.RunOptions.FULL_TRACE))

  def after_run(self, run_context, run_values):
    if not self._traced():
      return
    if self._output_dir:
      os.makedirs(self._output_dir, exist_ok=True)
    metadata = run_values.run_metadata
    if self._dump_metadata:
      with open(os.path.join(self._output_dir,
                             "run_metadata_%d.bin" % self._run), "wb") as out:
        pickle.dump(metadata.SerializeToString(), out)
    self.results[self._run] = profile_memory(
        metadata, run_context.session.graph, "step_%d_" % self._run,
        self._visualize, self._output_dir)
