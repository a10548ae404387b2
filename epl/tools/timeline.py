"""The pipeline timeline of one training step: when each stage ran the
forward and backward pass of each micro-batch, and its peak memory.

    from epl import timeline
    values, trace = timeline.trace_step(sess, train_op)
    trace.save_chrome_trace("step.json")   # chrome://tracing or Perfetto
    trace.save_gantt("step.png")           # needs matplotlib (extra "plot")
    trace.order(stage=0)    # [("forward", 0), ("forward", 1), ...]
    trace.peak_memory()     # {"stage 0 (replica 0) /device:CPU:0": bytes}

The step runs with a full trace (`RunOptions.FULL_TRACE`); each op of the
step stats is looked up in what the rewrite tagged: its replica, stage,
phase and micro-batch. A slice spans the first start to the last end of
the ops of one (replica, stage, phase, micro-batch) that compute on
micro-batch data (ops that read an op of a forward or backward block).
Under ZeroBubble a backward is two slices, "backward" (B, the input
gradients) and "weight" (W, the weight gradients).
"""
import collections
import dataclasses
import json

import tensorflow as tf

from epl.ir.graph_state import state_of
from epl.ir.phase import Phase
from epl.parallel.passes import schedule

_COLORS = {"forward": "#4c72b0", "backward": "#dd8452", "weight": "#55a868",
           "apply": "#8c8c8c"}
# Hatching of the passes of a device's first, second, ... stage in a
# Gantt chart by device.
_HATCHES = (None, "//", "xx", "..")


@dataclasses.dataclass
class Row:
  """One stage of one replica: a row of the timeline."""
  replica: int
  stage: int
  device: str

  @property
  def label(self):
    return "stage %d (replica %d) %s" % (self.stage, self.replica,
                                         self.device)


@dataclasses.dataclass
class Slice:
  """One (phase, micro-batch) of one row, in microseconds from the step's
  first op."""
  row: int
  # "forward", "backward" (its input-gradient part B under ZeroBubble),
  # "weight" (the weight-gradient part W, ZeroBubble) or "apply"
  phase: str
  micro_batch: object  # int, or None for "apply"
  start: float
  end: float

  @property
  def name(self):
    if self.micro_batch is None:
      return self.phase
    return "%s %d" % (self.phase, self.micro_batch)


def device_key(device):
  """(task, device type, index) of a device name, comparable across
  spellings ("/device:CPU:0", "/job:localhost/replica:0/task:0/device:CPU:0").
  """
  spec = tf.DeviceSpec.from_string(device)
  return (spec.task or 0, (spec.device_type or "").upper(),
          spec.device_index or 0)


def peak_memory_per_device(run_metadata):
  """{device (as in the step stats): peak bytes the step allocated there}.

  From the allocation records of a fully traced step: every allocation and
  deallocation made by an op of the device, in time order. Memory held
  before the step (variables) is not counted.
  """
  peaks = {}
  for device_stats in run_metadata.step_stats.dev_stats:
    records = sorted(
        (record.alloc_micros, record.alloc_bytes)
        for node in device_stats.node_stats for memory in node.memory
        for record in memory.allocation_records)
    live = peak = 0
    for _, size in records:
      live += size
      peak = max(peak, live)
    peaks[device_stats.device] = max(peaks.get(device_stats.device, 0), peak)
  return peaks


class PipelineTrace:
  """The slices and per-device peak memory of one traced step."""

  def __init__(self, rows, slices, device_peaks):
    self.rows = rows
    self.slices = slices
    self._device_peaks = device_peaks

  @classmethod
  def from_run_metadata(cls, graph, run_metadata):
    """Builds the trace of a step of `graph` (rewritten by EPL)."""
    state = state_of(graph)
    if state is None or state.rewrite_result is None:
      raise ValueError("The graph was not rewritten by EPL: run a training "
                       "step under epl.init() first.")
    result = state.rewrite_result
    ctx, plan = result.context, result.plan
    rows, row_of = [], {}
    for replica in ctx.replicas:
      for stage in range(plan.num_stages):
        row_of[(replica, stage)] = len(rows)
        rows.append(Row(replica, stage, plan.device(replica, stage)))
    by_block = schedule.blocks(ctx, result.subgraph, result.copies)
    # A forward or backward slice spans the ops that compute on
    # micro-batch data (read an op of a forward or backward block: W's
    # kernel gradients read B's and the forward's), not the variable reads
    # and constants that may run as soon as the step starts.
    data = {op.name for block, ops in by_block.items()
            if block.phase is not Phase.APPLY for op in ops}
    block_of = {}
    for block, ops in by_block.items():
      for op in ops:
        if block.phase is Phase.APPLY or any(
            t.op.name in data for t in op.inputs):
          block_of[op.name] = block
    spans = {}
    for device_stats in run_metadata.step_stats.dev_stats:
      for node in device_stats.node_stats:
        block = block_of.get(node.node_name)
        if block is None:
          continue
        start = node.all_start_micros
        end = start + node.all_end_rel_micros
        span = spans.get(block)
        spans[block] = (start, end) if span is None else (
            min(span[0], start), max(span[1], end))
    origin = min((s for s, _ in spans.values()), default=0)
    slices = sorted(
        (Slice(row_of[(b.replica, b.stage)], b.kind, b.micro_batch,
               start - origin, end - origin)
         for b, (start, end) in spans.items()),
        key=lambda s: (s.row, s.start))
    device_keys = {device_key(row.device): row for row in rows}
    peaks = {}
    for device, peak in peak_memory_per_device(run_metadata).items():
      row = device_keys.get(device_key(device))
      peaks[row.device if row else device] = peak
    return cls(rows, slices, peaks)

  def _row_index(self, stage, replica):
    for index, row in enumerate(self.rows):
      if row.stage == stage and row.replica == replica:
        return index
    raise ValueError("No stage %d in replica %d; rows: %s" %
                     (stage, replica, [r.label for r in self.rows]))

  def order(self, stage, replica=0,
            phases=("forward", "backward", "weight")):
    """[(phase, micro-batch)] that stage `stage` of `replica` ran, by start
    time."""
    row = self._row_index(stage, replica)
    return [(s.phase, s.micro_batch) for s in self.slices
            if s.row == row and s.phase in phases]

  def peak_memory(self):
    """{row label: peak bytes} for every row whose device was traced."""
    return {row.label: self._device_peaks[row.device] for row in self.rows
            if row.device in self._device_peaks}

  def chrome_trace(self):
    """The trace as Chrome trace-event JSON (a dict)."""
    events = [{"name": "process_name", "ph": "M", "pid": 0,
               "args": {"name": "EPL pipeline"}}]
    for index, row in enumerate(self.rows):
      events.append({"name": "thread_name", "ph": "M", "pid": 0,
                     "tid": index, "args": {"name": row.label}})
      events.append({"name": "thread_sort_index", "ph": "M", "pid": 0,
                     "tid": index, "args": {"sort_index": index}})
    for piece in self.slices:
      row = self.rows[piece.row]
      events.append({
          "name": piece.name, "cat": piece.phase, "ph": "X", "pid": 0,
          "tid": piece.row, "ts": piece.start,
          "dur": max(piece.end - piece.start, 1),
          "args": {"phase": piece.phase, "micro_batch": piece.micro_batch,
                   "stage": row.stage, "replica": row.replica,
                   "device": row.device}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}

  def save_chrome_trace(self, path):
    with open(path, "w") as out:
      json.dump(self.chrome_trace(), out, indent=1)
    return path

  def save_gantt(self, path, title=None, by_device=False):
    """Draws the step as a Gantt chart into `path`: one row per stage, or
    with `by_device` one per device of each replica, its stages' passes
    told apart by hatching (plain: the device's first stage, then "//",
    "xx", ...), as interleaved 1F1B runs several stages on a device."""
    try:
      import matplotlib  # pylint: disable=import-outside-toplevel
      matplotlib.use("Agg")
      from matplotlib import pyplot  # pylint: disable=import-outside-toplevel
    except ImportError as error:
      raise ImportError("save_gantt needs matplotlib: pip install "
                        "'epl[plot]' (%s)" % error)
    labels, line_of, hatch_of = self._gantt_lines(by_device)
    figure, axes = pyplot.subplots(figsize=(10, 0.6 * len(labels) + 1.2))
    for piece in self.slices:
      start, width = piece.start / 1e3, (piece.end - piece.start) / 1e3
      line = line_of[piece.row]
      # The update may start while the last backward ends: a thin bar.
      band = (line + 0.15, 0.25) if piece.micro_batch is None else (
          line - 0.4, 0.8)
      axes.broken_barh([(start, width)], band,
                       facecolors=_COLORS[piece.phase], edgecolor="white",
                       hatch=hatch_of[piece.row])
      if piece.micro_batch is not None:
        axes.text(start + width / 2, line, "%s%d" % (
            piece.phase[0].upper(), piece.micro_batch), ha="center",
                  va="center", color="white", fontsize=8)
    axes.set_yticks(range(len(labels)))
    axes.set_yticklabels(labels)
    axes.invert_yaxis()
    axes.set_xlabel("time (ms)")
    drawn = {piece.phase for piece in self.slices}
    handles = [matplotlib.patches.Patch(color=color, label=label)
               for label, color in _COLORS.items() if label in drawn]
    axes.legend(handles=handles, loc="upper center", ncol=len(handles),
                bbox_to_anchor=(0.5, -0.3), fontsize=8, frameon=False)
    if title:
      axes.set_title(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
    return path

  def _gantt_lines(self, by_device):
    """(line labels, line of each row, hatch of each row) of the Gantt
    chart: a line per row, or per (replica, device) with `by_device`."""
    if not by_device:
      return ([row.label for row in self.rows], list(range(len(self.rows))),
              [None] * len(self.rows))
    keys = list(dict.fromkeys((row.replica, row.device) for row in self.rows))
    stages = {key: [row.stage for row in self.rows
                    if (row.replica, row.device) == key] for key in keys}
    labels = ["%s (replica %d): stages %s" % (
        device, replica, ", ".join(str(s) for s in stages[(replica, device)]))
              for replica, device in keys]
    line_of, hatch_of = [], []
    for row in self.rows:
      key = (row.replica, row.device)
      line_of.append(keys.index(key))
      chunk = stages[key].index(row.stage)
      hatch_of.append(_HATCHES[chunk % len(_HATCHES)])
    return labels, line_of, hatch_of


def trace_step(session, fetches, feed_dict=None):
  """Runs one step with a full trace; returns (fetched values, trace)."""
  run_metadata = tf.compat.v1.RunMetadata()
  options = tf.compat.v1.RunOptions(
      trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
  values = session.run(fetches, feed_dict=feed_dict, options=options,
                       run_metadata=run_metadata)
  return values, PipelineTrace.from_run_metadata(session.graph, run_metadata)
