"""Static cost of ops: FLOPs, tensor bytes and parameter bytes from shapes,
aggregated per op, per TaskGraph (pipeline stage), and a SessionRunHook that
logs FLOPs per TaskGraph and the FLOP/s a training step achieves.

FLOPs come from TensorFlow's own registered statistics
(`ops.get_stats_for_node_def(graph, node_def, "flops")`, the table behind
`tf.compat.v1.profiler`); the op types TensorFlow has no statistic for and
that transformer and MLP models use (Einsum, Tanh, Erf, Exp, LogSoftmax, the
softmax cross-entropies, Select, ...) are registered here, in TensorFlow's
registry, so `tf.compat.v1.profiler` counts them too. Ops with no statistic
(data movement: Reshape, Transpose, Gather, ...) count 0 FLOPs.

TensorFlow's statistics need fully known shapes. Here every count takes a
`shape_of(tensor)` function, so a count can use static shapes whose unknown
dimensions (an unknown batch size) are filled in (`static_shape`), or the
shapes a traced step actually had (`FlopsProfilerHook`).

The small API the cost model and the planner use:
  op_flops(op, shape_of)          FLOPs of one op
  tensor_bytes(tensor, shape_of)  bytes of one tensor
  variable_bytes(variable_op)     bytes of one variable
  summarize(ops, shape_of)        Cost(ops, flops, parameter and activation
                                  bytes) of a set of ops
  profile_flops(graph, ...)       {op name: FLOPs}; the original EPL's
                                  profile_flops(session, run_metadata, cmds)
                                  gives a traced step's total
  taskgraph_costs(graph, ops)     {TaskGraph index: Cost}
"""
import collections
import dataclasses
import logging
import math
import time

import tensorflow as tf

from epl.ir import graph_editor
from epl.ir.graph_state import state_of
from epl.ir.op_types import VARIABLE_TYPES
from epl.tf_compat import stats

logger = logging.getLogger("epl")

# ------------------------------------------------------------------ shapes


def static_shape(tensor, unknown_dim=1):
  """`tensor`'s static shape as a list of ints, each unknown dimension
  taken as `unknown_dim`; None when even the rank is unknown."""
  if tensor.shape.rank is None:
    return None
  return [unknown_dim if d is None else d for d in tensor.shape.as_list()]


class _ShapeView:
  """Stands in for the graph when a FLOPs statistic looks a tensor up
  (TensorFlow's statistics read shapes only through
  `graph.get_tensor_by_name(name).get_shape()`): the shape is
  `shape_of(tensor)`."""

  def __init__(self, graph, shape_of):
    self._graph = graph
    self._shape_of = shape_of

  def get_tensor_by_name(self, name):
    shape = self._shape_of(self._graph.get_tensor_by_name(name))
    return _Shaped(tf.TensorShape(shape))


class _Shaped:

  def __init__(self, shape):
    self._shape = shape

  def get_shape(self):
    return self._shape


def _elements(shape):
  return math.prod(shape.as_list()) if shape.is_fully_defined() else None


def _shape(graph, name):
  return stats.tensor_shape_from_node_def_name(graph, name)


# ------------------------------------------- statistics TensorFlow lacks


def _stats(value):
  return stats.OpStats("flops", value)


def _per_output_element(count):
  def statistic(graph, node):
    elements = _elements(_shape(graph, node.name))
    return _stats(None if elements is None else count * elements)
  return statistic


def _per_input_element(count):
  def statistic(graph, node):
    elements = _elements(_shape(graph, node.input[0]))
    return _stats(None if elements is None else count * elements)
  return statistic


def einsum_flops(equation, shapes):
  """FLOPs of `tf.einsum(equation, *operands)` with operand `shapes`
  (lists of ints): every combination of the labels' values is one
  multiply-add (2 FLOPs) when labels are summed over and there are two or
  more operands, one multiply when nothing is summed; one operand costs one
  add per element when summed, nothing when only transposed."""
  inputs, _, output = equation.replace(" ", "").partition("->")
  terms = inputs.split(",")
  if len(terms) != len(shapes):
    raise ValueError("Einsum %r has %d operands, %d shapes given." %
                     (equation, len(terms), len(shapes)))
  sizes = {}
  ellipsis_labels = []
  for term, shape in zip(terms, shapes):
    if "..." in term:
      head, tail = term.split("...")
      broadcast = len(shape) - len(head) - len(tail)
      # Ellipsis dimensions line up from the right, broadcasting.
      labels = ["#%d" % i for i in range(broadcast, 0, -1)]
      ellipsis_labels = max(ellipsis_labels, labels, key=len)
      labels = list(head) + labels + list(tail)
    else:
      labels = list(term)
    for label, size in zip(labels, shape):
      sizes[label] = max(sizes.get(label, 1), size)
  if "->" not in equation:
    # Implicit output: the labels that occur once, in alphabetical order.
    counts = collections.Counter(c for t in terms for c in t if c != ".")
    output = "".join(sorted(c for c, n in counts.items() if n == 1))
  kept = set(output.replace("...", "")) | (
      set(ellipsis_labels) if "..." in output or "->" not in equation else
      set())
  combinations = math.prod(sizes.values())
  summed = bool(set(sizes) - kept)
  if len(terms) == 1:
    return combinations if summed else 0
  return (2 if summed else 1) * (len(terms) - 1) * combinations


def _einsum(graph, node):
  shapes = [_shape(graph, name) for name in node.input
            if not name.startswith("^")]
  if not all(s.is_fully_defined() for s in shapes):
    return _stats(None)
  return _stats(einsum_flops(node.attr["equation"].s.decode(),
                             [s.as_list() for s in shapes]))


def _softmax_cross_entropy(graph, node):
  # A softmax over the logits (5 per element, as TensorFlow counts
  # Softmax), the log and the product with the labels.
  elements = _elements(_shape(graph, node.input[0]))
  return _stats(None if elements is None else 7 * elements)


# FLOPs per output element of the element-wise ops TensorFlow has no
# statistic for (forward and gradient ops).
_ELEMENTWISE = {
    "Abs": 1, "Ceil": 1, "Cos": 1, "DivNoNan": 1, "Elu": 1, "EluGrad": 2,
    "Erf": 1, "Exp": 1, "Expm1": 1, "Floor": 1, "FloorDiv": 1,
    "FloorMod": 1, "LeakyRelu": 1, "LeakyReluGrad": 1, "Log1p": 1,
    "Relu": 1, "Relu6": 1, "Relu6Grad": 1, "ReluGrad": 1, "Select": 1,
    "SelectV2": 1, "Selu": 1, "SeluGrad": 2, "Sigmoid": 1,
    "SigmoidGrad": 2, "Sign": 1, "Sin": 1, "Softplus": 1, "SoftplusGrad": 2,
    "Sqrt": 1, "SqrtGrad": 2, "Tanh": 1, "TanhGrad": 2, "TruncateDiv": 1,
    "Xdivy": 1, "Xlogy": 1,
}
# FLOPs per input element of reductions TensorFlow does not count.
_REDUCTIONS = {"Max": 1, "Min": 1, "Prod": 1, "Cumsum": 1, "Cumprod": 1,
               "UnsortedSegmentSum": 1, "SegmentSum": 1}
_OTHER = {
    "Einsum": _einsum,
    "LogSoftmax": _per_output_element(5),
    "SoftmaxCrossEntropyWithLogits": _softmax_cross_entropy,
    "SparseSoftmaxCrossEntropyWithLogits": _softmax_cross_entropy,
}


def _register_missing_statistics():
  """Registers the statistics above for the op types TensorFlow lacks
  (TensorFlow's own count wins where it has one)."""
  table = dict(_OTHER)
  table.update({t: _per_output_element(c) for t, c in _ELEMENTWISE.items()})
  table.update({t: _per_input_element(c) for t, c in _REDUCTIONS.items()})
  for op_type, statistic in table.items():
    try:
      stats.register_statistics(op_type, "flops", statistic)
    except KeyError:
      pass  # TensorFlow counts this type itself


_register_missing_statistics()


# ------------------------------------------------------------------ counts


def op_flops(op, shape_of=static_shape):
  """FLOPs of one run of `op`, with tensor shapes from `shape_of(tensor)`
  (a list of ints, or None when unknown); 0 for op types without a
  statistic and for unknown shapes."""
  def known(tensor):
    shape = shape_of(tensor)
    if shape is None:
      raise _UnknownShape()
    return shape
  try:
    result = stats.stats_for_node_def(_ShapeView(op.graph, known),
                                      op.node_def, "flops")
  except _UnknownShape:
    return 0
  # TensorFlow counts a reduction as input less output elements, negative
  # for shapes that grappler changed after the trace.
  return max(int(result.value or 0), 0)


class _UnknownShape(Exception):
  pass


def tensor_bytes(tensor, shape_of=static_shape):
  """Bytes of `tensor` (0 for resource, variant and string tensors, whose
  size a shape does not tell, and for unknown shapes)."""
  dtype = tensor.dtype.base_dtype
  if dtype in (tf.resource, tf.variant, tf.string):
    return 0
  shape = shape_of(tensor)
  return 0 if shape is None else dtype.size * math.prod(shape)


def variable_elements(variable_op):
  """Elements of the variable `variable_op` (VarHandleOp or VariableV2); 0
  when its shape is not fully known."""
  if variable_op.type == "VarHandleOp":
    shape = tf.TensorShape(variable_op.get_attr("shape"))
  else:
    shape = variable_op.outputs[0].shape
  return shape.num_elements() if shape.is_fully_defined() else 0


def variable_bytes(variable_op):
  """Bytes of the variable `variable_op`; 0 when its shape is not fully
  known."""
  dtype = tf.as_dtype(variable_op.get_attr("dtype")).base_dtype
  return dtype.size * variable_elements(variable_op)


def activation_bytes(op, shape_of=static_shape):
  """Bytes of `op`'s floating-point outputs: what a forward op hands on,
  and what the backward pass may keep of it."""
  if op.type in VARIABLE_TYPES:
    return 0
  return sum(tensor_bytes(t, shape_of) for t in op.outputs
             if t.dtype.base_dtype.is_floating)


@dataclasses.dataclass
class Cost:
  """What a set of ops costs: op count, FLOPs of one run, bytes of the
  variables among them, bytes of their floating-point outputs."""
  ops: int = 0
  flops: int = 0
  parameter_bytes: int = 0
  activation_bytes: int = 0

  def __add__(self, other):
    return Cost(self.ops + other.ops, self.flops + other.flops,
                self.parameter_bytes + other.parameter_bytes,
                self.activation_bytes + other.activation_bytes)

  def describe(self):
    return ("%d ops, %s FLOPs, parameters %s, activations %s" % (
        self.ops, human_count(self.flops), human_bytes(self.parameter_bytes),
        human_bytes(self.activation_bytes)))


def op_cost(op, shape_of=static_shape):
  """The Cost of one op."""
  if op.type in VARIABLE_TYPES:
    return Cost(1, 0, variable_bytes(op), 0)
  return Cost(1, op_flops(op, shape_of), 0, activation_bytes(op, shape_of))


def summarize(ops, shape_of=static_shape):
  """The Cost of `ops` together."""
  total = Cost()
  for op in ops:
    total += op_cost(op, shape_of)
  return total


def profile_flops(graph=None, ops=None, unknown_dim=1):
  """{op name: FLOPs} of `ops` (default: every op of `graph`, default the
  default graph) from static shapes, unknown dimensions taken as
  `unknown_dim` (pass the batch size when the model's is unknown).

  The original EPL's form, `profile_flops(session, run_metadata, cmds)`,
  returns the total FLOPs of every op of the session's graph, with the
  shapes the traced step (`run_metadata`) recorded, and logs them per view
  of `cmds` (see `FlopsProfilerHook`).
  """
  if graph is not None and not isinstance(graph, tf.Graph):
    return _profile_traced(graph.graph, ops, unknown_dim)
  graph = graph or tf.compat.v1.get_default_graph()
  ops = graph.get_operations() if ops is None else ops

  def shape_of(tensor):
    return static_shape(tensor, unknown_dim)
  return {op.name: op_flops(op, shape_of) for op in ops}


def _profile_traced(graph, run_metadata, cmds):
  shape_of = _traced_shape_of(graph, traced_shapes(run_metadata))
  counts = {op.name: op_flops(op, shape_of) for op in graph.get_operations()}
  _log_views(counts, graph, _views(cmds))
  return sum(counts.values())


# The original EPL's views of a FLOPs profile (tf.profiler's cmds): by top
# name scope, by op type, by op.
_VIEWS = ("scope", "op", "graph")
_VIEW_ENTRIES_LOGGED = 10


def _views(cmds):
  cmds = [cmds] if isinstance(cmds, str) else cmds
  if not isinstance(cmds, (list, tuple)) or any(c not in _VIEWS
                                                for c in cmds):
    raise ValueError("FLOPs profiler cmds=%r: give one of %s or a list of "
                     "them." % (cmds, ", ".join('"%s"' % v for v in _VIEWS)))
  return list(cmds)


def _log_views(counts, graph, cmds):
  """Logs FLOPs `counts` ({op name: FLOPs}) grouped per view of `cmds`:
  "scope" by top-level name scope, "op" by op type, "graph" by op; the
  largest groups first."""
  for cmd in cmds:
    groups = collections.Counter()
    for name, count in counts.items():
      if cmd == "scope":
        key = name.split("/", 1)[0]
      elif cmd == "op":
        key = graph.get_operation_by_name(name).type
      else:
        key = name
      groups[key] += count
    logger.info("FLOPs profiler (%s): %s FLOPs in total; %s", cmd,
                human_count(sum(counts.values())), ", ".join(
                    "%s %s" % (key, human_count(count)) for key, count in
                    groups.most_common(_VIEW_ENTRIES_LOGGED)))


def taskgraph_costs(graph, ops, shape_of=static_shape):
  """{TaskGraph index: Cost} of `ops` by the TaskGraph capture gave each
  (None for ops without one)."""
  state = state_of(graph)
  costs = collections.defaultdict(Cost)
  for op in ops:
    taskgraph = state.taskgraph_of(op) if state is not None else None
    costs[taskgraph.index if taskgraph is not None else None] += op_cost(
        op, shape_of)
  return dict(costs)


def human_count(value):
  """`value` with a K/M/G/T suffix: 1.23G."""
  for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
    if abs(value) >= scale:
      return "%.2f%s" % (value / scale, unit)
  return "%d" % value


def human_bytes(value):
  """Bytes with a K/M/G/T suffix: 4.80MB."""
  return human_count(value) + "B"


# ------------------------------------------------------------------ hook


def traced_shapes(run_metadata):
  """{tensor name: shape} of the outputs a traced step recorded."""
  shapes = {}
  for device in run_metadata.step_stats.dev_stats:
    for node in device.node_stats:
      for output in node.output:
        dims = [d.size for d in output.tensor_description.shape.dim]
        if all(d >= 0 for d in dims):
          shapes["%s:%d" % (node.node_name, output.slot)] = dims
  return shapes


def _traced_shape_of(graph, shapes):
  """shape_of from a traced step's shapes. A tensor the trace lacks (an op
  grappler fused away) takes its static shape, unknown dimensions taken as
  the size the traced tensors most often had where their static shape left
  the first dimension open (the batch)."""
  batch_sizes = collections.Counter()
  for name, traced in shapes.items():
    try:
      static = graph.get_tensor_by_name(name).shape
    except (KeyError, ValueError):
      continue  # a node grappler added
    if static.rank and traced and static.as_list()[0] is None:
      batch_sizes[traced[0]] += 1
  fill = batch_sizes.most_common(1)[0][0] if batch_sizes else 1

  def shape_of(tensor):
    shape = shapes.get(tensor.name)
    return shape if shape is not None else static_shape(tensor, fill)
  return shape_of


class FlopsProfilerHook(tf.compat.v1.train.SessionRunHook):
  """Logs the FLOPs of each TaskGraph per step and the FLOP/s achieved.

  The step run at `trace_step` (counted from 1) is traced
  (`RunOptions.FULL_TRACE`): its ops are those its fetches depend on, each
  counted with the shapes the trace recorded. The steps after it are
  timed; every `log_steps` of them, one INFO line gives FLOPs per step,
  the mean step time and FLOP/s. The figures are kept on the hook:
  `op_flops` ({op name: FLOPs per step}), `taskgraph_flops` ({TaskGraph
  index: FLOPs per step}, None for ops of no TaskGraph), `flops_per_step`,
  `step_times` and `flops_per_second`. In a rewritten graph a TaskGraph's
  figure covers all its replicas and micro-batches on this worker.

  `cmds` (the original EPL's argument: "scope", "op", "graph" or a list
  of them, also taken as the first positional argument) also logs the
  traced step's FLOPs grouped by top-level name scope, op type or op.
  """

  def __init__(self, log_steps=10, trace_step=1, cmds=()):
    if isinstance(log_steps, (str, list, tuple)):
      log_steps, cmds = 10, log_steps
    self._cmds = _views(cmds)
    if log_steps < 1 or trace_step < 1:
      raise ValueError("FlopsProfilerHook(log_steps=%r, trace_step=%r): both "
                       "must be >= 1." % (log_steps, trace_step))
    self._log_steps = log_steps
    self._trace_step = trace_step
    self._step = 0
    self._start = None
    self.op_flops = None
    self.taskgraph_flops = None
    self.flops_per_step = None
    self.step_times = []

  @property
  def flops_per_second(self):
    """FLOPs per step over the mean timed step; None before any."""
    if not self.step_times or self.flops_per_step is None:
      return None
    return self.flops_per_step / (sum(self.step_times) / len(self.step_times))

  def before_run(self, run_context):
    self._step += 1
    self._start = time.time()
    if self._step == self._trace_step:
      return tf.compat.v1.train.SessionRunArgs(
          fetches=None, options=tf.compat.v1.RunOptions(
              trace_level=tf.compat.v1.RunOptions.FULL_TRACE))
    return None

  def after_run(self, run_context, run_values):
    elapsed = time.time() - self._start
    if self._step == self._trace_step:
      self._profile(run_context, run_values.run_metadata)
    elif self.flops_per_step is not None:
      self.step_times.append(elapsed)
      if len(self.step_times) % self._log_steps == 0:
        recent = self.step_times[-self._log_steps:]
        mean = sum(recent) / len(recent)
        logger.info("FLOPs profiler: %s FLOPs per step, %.4f s per step, "
                    "%sFLOP/s", human_count(self.flops_per_step), mean,
                    human_count(self.flops_per_step / mean))

  def _profile(self, run_context, run_metadata):
    graph = run_context.session.graph
    roots = []
    for fetch in tf.nest.flatten(run_context.original_args.fetches):
      fetch = graph.as_graph_element(fetch)
      roots.append(fetch if isinstance(fetch, tf.Operation) else fetch.op)
    step_ops = graph_editor.ancestors(roots)
    shape_of = _traced_shape_of(graph, traced_shapes(run_metadata))
    self.op_flops = {op.name: op_flops(op, shape_of) for op in step_ops}
    state = state_of(graph)
    per_taskgraph = collections.Counter()
    for op in step_ops:
      taskgraph = state.taskgraph_of(op) if state is not None else None
      per_taskgraph[None if taskgraph is None else taskgraph.index] += (
          self.op_flops[op.name])
    self.taskgraph_flops = dict(per_taskgraph)
    self.flops_per_step = sum(self.op_flops.values())
    _log_views(self.op_flops, graph, self._cmds)
    for index, count in sorted(per_taskgraph.items(),
                               key=lambda kv: (kv[0] is None, kv[0] or 0)):
      logger.info("FLOPs profiler: TaskGraph %s: %s FLOPs per step",
                  "-" if index is None else index, human_count(count))
