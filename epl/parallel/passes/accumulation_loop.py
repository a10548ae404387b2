"""Gradient accumulation as a loop: with one pipeline stage, the M
micro-batches of a step run as a v1 while-loop around the user's own
forward and backward ops instead of as M copies of them, so that the
graph, and TensorFlow's start-up work on it, do not grow with M.

The loop (`EPL_MICRO_BATCH_LOOP/while`, one iteration per micro-batch, one
at a time) takes into its frame the user's ops of one micro-batch that
differ between micro-batches (those that depend on the batch or on a
stateful op); the rest of the micro-batch (variable reads, values of
shared state) runs once before it, and what the loop reads from outside
enters it. The input reads stay outside: the M
reads of a step (the user's and M - 1 copies, as without the loop) fill a
TensorArray that iteration i reads its batch from, so batches still go to
micro-batch m of replica r in the order `tf.data` hands them out. A fed
batch (a placeholder `split_fed_batches` later splits) reaches the loop
the same way: M views of it fill the TensorArray, and each view is then
given its micro-batch's part. Each
gradient is summed over the iterations (dense: a loop-carried sum;
IndexedSlices: their rows concatenated through TensorArrays, as the copies
concatenate them), a forward state update (batch norm's moving averages)
gets the mean of its value, and every other value the step hands out of
the micro-batch (the loss a script fetches, a summary's input) is kept per
iteration in a TensorArray, read after the loop.
"""
import collections

import tensorflow as tf

from epl.ir import control_flow
from epl.ir import graph_editor
from epl.ir import names as epl_names
from epl.ir.op_types import (FUNCTION_BODY_TYPES, INPUT_READ_TYPES,
                             PLACEHOLDER_TYPES, VARIABLE_READ_TYPES,
                             VARIABLE_TYPES)
from epl.ir.phase import Phase
from epl.parallel.passes.fed_batches import is_fed_batch
from epl.parallel.passes.forward_state import forward_writes
from epl.parallel.passes.merge_outputs import MERGES
from epl.parallel.passes.random_seeds import SEED_INPUT_TYPES
from epl.parallel.passes.training_subgraph import tensors_of
from epl.parallel.plan.decisions import Reduction

_NOT_KEPT_DTYPES = (tf.resource, tf.variant)


def _varies_by_itself(op):
  """Whether `op` gives, or must give, another value in each micro-batch
  with the same inputs: a stateful op other than a variable or its read,
  or a stateless random op (which the copies give a seed each)."""
  return op.type in SEED_INPUT_TYPES or (
      op.op_def.is_stateful and
      op.type not in VARIABLE_TYPES | VARIABLE_READ_TYPES)


def _reads_fed_batch(op):
  """Whether `op` reads a fed batch (a placeholder `split_fed_batches`
  gives each micro-batch its part of): it differs between micro-batches
  as a reader of an input read does."""
  return any(t.op.type in PLACEHOLDER_TYPES and is_fed_batch(t.op)
             for t in op.inputs)


class _Layout:
  """Which ops of one micro-batch run in the loop, and how the loop meets
  the rest of the step."""

  def __init__(self, ctx, subgraph, selected, points):
    self.selected_names = {op.name for op in selected}
    self.reads = [op for op in selected if op.type in INPUT_READ_TYPES]
    self.writes = [w for w in forward_writes(ctx, subgraph)
                   if w.name in self.selected_names]
    # What reads a forward write's result (the read a variable update
    # returns) runs after the loop with it; the ops that only wait for a
    # write (tf.control_dependencies(UPDATE_OPS)) no longer do, as
    # average_forward_state_updates has it.
    write_names = {w.name for w in self.writes}
    after_writes = {op.name for op in graph_editor.reachable(
        self.writes, lambda op: (
            [c for t in op.outputs for c in t.consumers()]
            if op.name in write_names else graph_editor.output_ops(op)))}
    candidates = [op for op in selected if op.type not in INPUT_READ_TYPES
                  and op.name not in after_writes]
    # Only what differs between micro-batches runs in the loop: what
    # depends on the batch read or fed, or on a stateful op (a random op draws
    # anew each iteration). The rest (constants, reads of the replica's
    # own variables, values computed from shared state such as a learning
    # rate from global_step) is the same in every iteration: it runs once,
    # before the loop, and enters it. Measured: with a shared variable's
    # read moved in, a replica's loop spanned two devices and its first
    # step never ended.
    names_ = {op.name for op in candidates}
    varying = graph_editor.reachable(
        self.reads + [op for op in candidates
                      if _varies_by_itself(op) or _reads_fed_batch(op)],
        lambda op: [o for o in graph_editor.output_ops(op)
                    if o.name in names_])
    varying_names = {op.name for op in varying}
    # A constant only the loop reads is made in it (one op; outside, it
    # would need an Enter too).
    self.moved = [op for op in candidates if op.name in varying_names or (
        op.type == "Const" and not op.inputs and not op.control_inputs and
        all(c.name in varying_names for t in op.outputs
            for c in t.consumers()))]
    self.moved_names = {op.name for op in self.moved}
    self.after_writes = after_writes
    # The gradients, and the ops of the step that read them (post-
    # processing, the optimizer): they read the sum instead.
    self.points = [(name, grad) for name, grad in points.items()
                   if tensors_of(grad)[0].op.name in self.selected_names]
    self.gradient_readers = {}
    for _, grad in self.points:
      for tensor in tensors_of(grad):
        self.gradient_readers[tensor.name] = [
            c for c in tensor.consumers()
            if c.name in subgraph.cloned_names and
            c.name not in self.selected_names]
    self.write_values = [w.inputs[1] for w in self.writes
                         if w.inputs[1].op.name in self.moved_names]
    self.kept, self.kept_readers = self._kept_values(ctx)
    # Ops outside the loop that wait for one of its ops wait for the loop.
    self.waiting = [(op, [w for w in graph_editor.control_outputs(op)
                          if w.name not in self.moved_names])
                    for op in self.moved]

  def _unused_backward(self, ctx):
    """Names of the backward ops outside the micro-batch that nothing but
    such ops reads (the gradient of an input, which tf.gradients builds
    and nothing runs): they stay where they are."""
    candidates = {op.name: op for op in ctx.graph.get_operations()
                  if op.name not in self.selected_names and
                  ctx.state.phase_of(op) is Phase.BACKWARD}
    used = graph_editor.reachable(
        [op for op in candidates.values()
         if any(o.name not in candidates for o in graph_editor.output_ops(op))],
        lambda op: [i for i in graph_editor.input_ops(op)
                    if i.name in candidates])
    return set(candidates) - {op.name for op in used}

  def _kept_values(self, ctx):
    """The tensors of the loop kept per iteration, and the ops outside it
    that read them."""
    unused = self._unused_backward(ctx)
    handled = {t.name for t in self.write_values}
    handled.update(self.gradient_readers)
    readers = collections.OrderedDict()
    fetched = set()
    for key in list(MERGES) + [tf.compat.v1.GraphKeys.LOSSES]:
      fetched.update(t.name for t in ctx.graph.get_collection(key)
                     if isinstance(t, tf.Tensor))
    for op in self.moved:
      for tensor in op.outputs:
        outside = [c for c in tensor.consumers()
                   if c.name not in self.moved_names and
                   c.name not in unused]
        if tensor.name in handled:
          outside = [c for c in outside
                     if c not in self.gradient_readers.get(tensor.name, [])
                     and c not in self.writes]
        leaf = (not tensor.consumers() and
                ctx.state.phase_of(op) is Phase.FORWARD)
        if outside or leaf or tensor.name in fetched:
          readers[tensor.name] = (tensor, outside)
    kept = [tensor for tensor, _ in readers.values()]
    return kept, {name: outside for name, (_, outside) in readers.items()}

  def reason_for_copies(self):
    """Why this micro-batch cannot run as a loop: (op name, reason), or
    None when it can. (What the configuration rules out, the plan decided
    before: `decisions.MicroBatching`.)"""
    for op in self.moved:
      if control_flow.context_of(op) is not None or (
          op.type in control_flow.V1_CONTROL_FLOW_TYPES):
        return (op.name, "is TF1 control flow (tf.cond / tf.while_loop "
                         "under control flow v1), which EPL does not nest "
                         "in its loop")
      if op.type in SEED_INPUT_TYPES:
        return (op.name, "is a stateless random op, which would draw the "
                         "same numbers in every iteration")
      if op.type in FUNCTION_BODY_TYPES:
        return (op.name, "runs a function body (a tf.function call or TF2 "
                         "control flow), which EPL does not put in its "
                         "loop yet")
    for name, grad in self.points:
      if tensors_of(grad)[0].op.name not in self.moved_names:
        return (tensors_of(grad)[0].op.name,
                "computes a gradient from a forward state update's result")
      values = grad.values if isinstance(grad, tf.IndexedSlices) else grad
      shape = values.shape[1:] if isinstance(grad, tf.IndexedSlices) else (
          values.shape)
      if not shape.is_fully_defined():
        return (values.op.name, "computes a gradient of unknown static "
                                "shape %s" % values.shape)
    for value in self.write_values:
      if not value.shape.is_fully_defined():
        return (value.op.name, "updates forward state with a value of "
                               "unknown static shape %s" % value.shape)
    for tensor in self.kept:
      if tensor.dtype.base_dtype in _NOT_KEPT_DTYPES:
        return (tensor.op.name, "hands a %s out of the micro-batch" %
                tensor.dtype.name)
    inside_or_after = {op.name for op in graph_editor.descendants(self.moved)}
    for op in self.moved:
      for producer in [t.op for t in op.inputs] + list(op.control_inputs):
        if producer.name in self.moved_names:
          continue
        if producer.name in inside_or_after and not (
            producer.name in self.after_writes and
            producer in op.control_inputs):
          return (producer.name, "reads the micro-batch and is read by it")
    return None


def layout(ctx, subgraph, selected, points):
  """How the micro-batch ops `selected` (with the gradients `points`,
  {name: gradient}) would run as a loop: a `_Layout`, whose
  `reason_for_copies()` says whether they can."""
  return _Layout(ctx, subgraph, selected, points)


def _tensor_array(like, count):
  return tf.TensorArray(like.dtype.base_dtype, size=count, infer_shape=False,
                        element_shape=like.shape)


def _micro_batch_inputs(ctx, plan_layout, copies, read_copies):
  """[(tensor the loop's ops read, its value in each micro-batch)]: the
  outputs of the input reads (the user's read and its copies
  `read_copies`, [{name: copy}] for micro-batches 1..M-1) and the fed
  batches (M views of the placeholder, which `split_fed_batches` later
  gives their parts)."""
  count = ctx.plan.num_micro_batch
  state = ctx.state
  read_copies = [{}] + [dict(clones) for clones in read_copies]
  sources = []
  for read in plan_layout.reads:
    for index, output in enumerate(read.outputs):
      if any(c.name in plan_layout.moved_names for c in output.consumers()):
        sources.append((output, [output] + [
            read_copies[m][read.name].outputs[index]
            for m in range(1, count)]))
  placeholders = collections.OrderedDict(
      (t.name, t) for op in plan_layout.moved for t in op.inputs
      if t.op.type in PLACEHOLDER_TYPES and is_fed_batch(t.op))
  taskgraph = state.taskgraph_of(plan_layout.moved[0])
  for fed in placeholders.values():
    views = []
    for micro_batch in range(count):
      view = tf.identity(fed, name="fed_batch_%d" % micro_batch)
      state.tag(view.op, taskgraph, Phase.FORWARD, micro_batch)
      read_copies[micro_batch][view.op.name] = view.op
      views.append(view)
    sources.append((fed, views))
  for micro_batch in range(1, count):
    copies.micro_batches.append(read_copies[micro_batch])
  copies.micro_batches[0].update(read_copies[0])
  return sources


class _Scale:
  """Divides a sum of the micro-batches by their count M (for the mean):
  one constant per dtype, built on first use."""

  def __init__(self, count, mean):
    self.count = count
    self.mean = mean
    self._counts = {}

  def __call__(self, tensor, always=False):
    if not (self.mean or always):
      return tensor
    if tensor.dtype not in self._counts:
      self._counts[tensor.dtype] = tf.constant(self.count, tensor.dtype,
                                               name="micro_batches")
    return tensor / self._counts[tensor.dtype]


def _input_arrays(sources, indices, count):
  """[(input tensor, TensorArray of its value in each micro-batch)]."""
  inputs = []
  for tensor, values in sources:
    array = _tensor_array(tensor, count)
    for index, value in zip(indices, values):
      array = array.write(index, value)
    inputs.append((tensor, array))
  return inputs


def _summed_groups(plan_layout, dense):
  """The dense values summed over the iterations, flattened into one loop
  variable per dtype (and per kind: forward state updates are always
  averaged): a loop variable costs seven ops per replica, a value in a flat
  sum three. {(dtype, always averaged): [values]}."""
  groups = collections.OrderedDict()
  for _, grad in dense:
    groups.setdefault((grad.dtype, False), []).append(grad)
  for value in plan_layout.write_values:
    groups.setdefault((value.dtype, True), []).append(value)
  return groups


def _move_into_loop(plan_layout, index, inputs, gate, outside_controls):
  """Makes the moved ops join the frame of the loop whose counter is
  `index`: inputs from outside enter it (the batch's inputs are read from
  their TensorArrays), control inputs from outside wait for `gate`."""
  moved, moved_names = plan_layout.moved, plan_layout.moved_names
  context = control_flow.control_flow_context(index.op)
  for op in moved:
    control_flow.join_while_context(op, context)
  pivot = control_flow.while_control_pivot(context)
  arrays = dict((t.name, a) for t, a in inputs)
  entered = {}

  def inside(tensor):
    if tensor.name not in entered:
      array = arrays.get(tensor.name)
      entered[tensor.name] = (
          array.read(index) if array is not None else
          control_flow.enter_while_context(context, tensor))
    return entered[tensor.name]
  gate_inside = tf.identity(gate).op if gate is not None else None
  for op in moved:
    for position, tensor in enumerate(op.inputs):
      if tensor.op.name not in moved_names:
        graph_editor.update_input(op, position, inside(tensor))
    controls = list(op.control_inputs)
    if any(c.name not in moved_names for c in controls):
      graph_editor.remove_all_control_inputs(op)
      kept_controls = [c for c in controls if c.name in moved_names]
      if any(c.name in outside_controls for c in controls):
        kept_controls.append(gate_inside)
      if kept_controls:
        graph_editor.add_control_inputs(op, kept_controls)
    if not op.inputs and not op.control_inputs:
      graph_editor.add_control_inputs(op, [pivot])


def _loop_body(plan_layout, inputs, gate, outside_controls, groups,
               kept_values):
  """The while-loop's body: one micro-batch, its sums and kept values."""

  def body(index, totals, arrays):
    _move_into_loop(plan_layout, index, inputs, gate, outside_controls)
    flat_shape = tf.constant([-1], name="flat")
    flats = []
    for values in groups.values():
      parts = [tf.reshape(v, flat_shape) for v in values]
      flats.append(parts[0] if len(parts) == 1 else tf.concat(parts, 0))
    totals = [total + flat for total, flat in zip(totals, flats)]
    arrays = [array.write(index, value)
              for array, value in zip(arrays, kept_values)]
    # The loop ends (its Exits fire) only after the last iteration has
    # summed and kept everything: an update after the loop must not
    # overwrite a variable that iteration still reads.
    with tf.control_dependencies(
        [t.op for t in totals] + [a.flow.op for a in arrays]):
      return index + 1, totals, arrays
  return body


def _split_sums(groups, totals, scale):
  """{value name: its sum over the micro-batches} from the flat sums."""
  sums_by_name = {}
  for ((_, always), values), total in zip(groups.items(), totals):
    total = scale(total, always)
    pieces = [total] if len(values) == 1 else tf.split(
        total, [v.shape.num_elements() for v in values])
    for value, piece in zip(values, pieces):
      sums_by_name[value.name] = tf.reshape(piece, value.shape)
  return sums_by_name


def _read_kept(plan_layout, copies, arrays, indices):
  """Records each kept value's value per iteration in `copies.loop_values`;
  its readers read micro-batch 0's."""
  copies.loop_values = {}
  for tensor, array in zip(plan_layout.kept, arrays):
    values = [array.read(index) for index in indices]
    copies.loop_values[tensor.name] = values
    graph_editor.replace_input_in(plan_layout.kept_readers[tensor.name],
                                  tensor, values[0])


def _after_loop(plan_layout, copies, loop, groups, dense, sparse, scale,
                indices):
  """Wires the loop's results to their readers; returns the accumulated
  gradients by point name."""
  done, totals, arrays = loop
  for op, waiting in plan_layout.waiting:
    for other in waiting:
      graph_editor.remove_control_input(other, op)
      graph_editor.add_control_inputs(other, [done.op])
  sums_by_name = _split_sums(groups, totals, scale)
  accumulated = {name: sums_by_name[grad.name] for name, grad in dense}
  for write in plan_layout.writes:
    if write.inputs[1].name in sums_by_name:
      graph_editor.update_input(write, 1, sums_by_name[write.inputs[1].name])
  _read_kept(plan_layout, copies, arrays, indices)
  sparse_arrays = arrays[len(plan_layout.kept):]
  for position, (name, grad) in enumerate(sparse):
    values, rows = (graph_editor.with_unknown_sizes(
        sparse_arrays[2 * position + part].concat()) for part in (0, 1))
    accumulated[name] = tf.IndexedSlices(scale(values), rows,
                                         grad.dense_shape)
  for name, grad in plan_layout.points:
    for old, new in zip(tensors_of(grad), tensors_of(accumulated[name])):
      graph_editor.replace_input_in(
          plan_layout.gradient_readers[old.name], old, new)
  return accumulated


def _build_loop(ctx, plan_layout, copies, read_copies, scale,
                outside_controls):
  """The loop's ops (see `run_as_loop`), in the default graph's current
  device and scope; returns the accumulated gradients by point name."""
  count = scale.count
  sources = _micro_batch_inputs(ctx, plan_layout, copies, read_copies)
  # One constant per micro-batch index, dtype and count, which every
  # TensorArray and sum shares.
  indices = [tf.constant(m, name="micro_batch_%d" % m)
             for m in range(count)]
  inputs = _input_arrays(sources, indices, count)
  gate = None
  if outside_controls:
    with tf.control_dependencies(list(outside_controls.values())):
      gate = tf.constant(True, name="after_outside_inputs")
  dense = [(name, grad) for name, grad in plan_layout.points
           if not isinstance(grad, tf.IndexedSlices)]
  sparse = [(name, grad) for name, grad in plan_layout.points
            if isinstance(grad, tf.IndexedSlices)]
  groups = _summed_groups(plan_layout, dense)
  sums = [tf.zeros([sum(v.shape.num_elements() for v in values)], dtype)
          for (dtype, _), values in groups.items()]
  sparse_parts = [part for _, grad in sparse
                  for part in (grad.values, grad.indices)]
  kept = [_tensor_array(t, count)
          for t in list(plan_layout.kept) + sparse_parts]
  kept_values = list(plan_layout.kept) + sparse_parts
  loop = tf.compat.v1.while_loop(
      lambda index, *_: index < count,
      _loop_body(plan_layout, inputs, gate, outside_controls, groups,
                 kept_values),
      (tf.constant(0), sums, kept), parallel_iterations=1, back_prop=False)
  return _after_loop(plan_layout, copies, loop, groups, dense, sparse, scale,
                     indices)


def run_as_loop(ctx, plan_layout, copies, read_copies):
  """Builds the loop of `plan_layout` (see the module) around the input
  reads' copies `read_copies` ([{name: copy}] for micro-batches 1..M-1);
  returns the ops built (the loop, its inputs and results) and the
  accumulated gradients by point name. Records the values kept per
  iteration in `copies.loop_values` and the reads' copies in
  `copies.micro_batches`."""
  graph = ctx.graph
  state = ctx.state
  count = ctx.plan.num_micro_batch
  mean = ctx.plan.decisions.reduction.value is Reduction.MEAN
  moved, moved_names = plan_layout.moved, plan_layout.moved_names
  taskgraph = state.taskgraph_of(moved[0])
  first_new = len(graph.get_operations())
  device = tensors_of(plan_layout.points[0][1])[0].op.device if (
      plan_layout.points) else moved[0].device
  outside_controls = {c.name: c for op in moved for c in op.control_inputs
                      if c.name not in moved_names and
                      c.name not in plan_layout.after_writes}
  with tf.device(device), tf.name_scope(epl_names.MICRO_BATCH_LOOP), \
      control_flow.building_v1_control_flow():
    accumulated = _build_loop(ctx, plan_layout, copies, read_copies,
                              _Scale(count, mean), outside_controls)
  built = graph.get_operations()[first_new:]
  for op in built:
    if state.taskgraph_of(op) is None:
      state.tag(op, taskgraph, Phase.BACKWARD)
  return built, accumulated
