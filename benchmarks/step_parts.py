"""Where a training step's time goes: one traced step (RunMetadata step
stats) split into forward, backward, gradient sums, updates and copies.

An op is put in a part by what it is, the same way for plain TensorFlow,
MirroredStrategy and EPL:

  copies     _Send/_Recv between devices (and host-device copies)
  sums       the gradient sums over replicas: ops under EPL's gradient
             aggregation scope, and AddN of gradients outside backward
             (MirroredStrategy's reduction)
  updates    what follows the gradients besides the sums: the optimizer
  backward   ops under a `gradients` name scope (tf.gradients)
  forward    everything else of the step (input reads included)

Each part's time is its busy time: the union of the intervals in which one
of its ops runs on any device, in ms. Parts overlap in time (replicas run
side by side, sums overlap backward), so they do not add up to the step;
`step` is the traced step's wall time from the first op to the last.
"""
import collections

PARTS = ("forward", "backward", "sums", "updates", "copies")
COPY_TYPES = frozenset(["_Send", "_Recv", "_HostSend", "_HostRecv",
                        "MemcpyHtoD", "MemcpyDtoH"])


def _in_backward(name):
  return any(part.startswith("gradients") for part in name.split("/")[:-1])


def classify(graph, fetches):
  """{op name: part} for the ops of `graph` that `fetches` run."""
  from epl.ir import graph_editor  # pylint: disable=import-outside-toplevel
  from epl.ir import names  # pylint: disable=import-outside-toplevel
  ops = graph_editor.ancestors([getattr(f, "op", f) for f in fetches])
  parts = {}
  backward = [op for op in ops if _in_backward(op.name)]
  for op in ops:
    if op.type in COPY_TYPES:
      parts[op.name] = "copies"
    elif names.GRADIENT_AGGREGATION in op.name.split("/")[0] or (
        op.type == "AddN" and not _in_backward(op.name) and
        any(_in_backward(t.op.name) for t in op.inputs)):
      parts[op.name] = "sums"
    elif _in_backward(op.name):
      parts[op.name] = "backward"
  after = {op.name for op in graph_editor.descendants(backward)}
  for op in ops:
    if op.name not in parts:
      parts[op.name] = "updates" if op.name in after else "forward"
  return parts


def _union_ms(intervals):
  total, end = 0, None
  for start, stop in sorted(intervals):
    if end is None or start > end:
      total += stop - start
      end = stop
    elif stop > end:
      total += stop - end
      end = stop
  return total / 1e3


def _op_type(node):
  label = node.timeline_label
  if " = " in label:
    return label.split(" = ", 1)[1].split("(", 1)[0].strip()
  return ""


def traced_parts(session, fetches, parts_of):
  """{part: busy ms, "step": wall ms} of one traced run of `fetches`;
  `parts_of`: classify()'s map for them."""
  import tensorflow.compat.v1 as tf  # pylint: disable=import-outside-toplevel
  metadata = tf.RunMetadata()
  session.run(fetches, options=tf.RunOptions(
      trace_level=tf.RunOptions.FULL_TRACE), run_metadata=metadata)
  intervals = collections.defaultdict(list)
  first, last = None, None
  for device in metadata.step_stats.dev_stats:
    for node in device.node_stats:
      start = node.all_start_micros
      stop = start + max(node.all_end_rel_micros, 0)
      first = start if first is None else min(first, start)
      last = stop if last is None else max(last, stop)
      if _op_type(node) in COPY_TYPES:
        part = "copies"
      else:
        part = parts_of.get(node.node_name.split(":")[0])
      if part is not None:
        intervals[part].append((start, stop))
  result = {part: _union_ms(intervals[part]) for part in PARTS}
  result["step"] = ((last - first) / 1e3) if first is not None else 0.0
  return result


def header():
  return "%-16s %-28s %9s" % ("model", "run (traced step, busy ms)",
                              "step") + "".join(
                                  " %9s" % part for part in PARTS)


def line(model, row, parts):
  return "%-16s %-28s %9.1f" % (model, row, parts["step"]) + "".join(
      " %9.1f" % parts[part] for part in PARTS)
