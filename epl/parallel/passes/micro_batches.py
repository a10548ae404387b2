"""Micro-batches: each step runs the forward and backward pass once per
micro-batch and applies the gradients, accumulated, once."""
import collections
import logging

import tensorflow as tf

from epl.ir import graph_editor
from epl.ir import names
from epl.ir.op_types import INPUT_READ_TYPES
from epl.ir.phase import Phase
from epl.parallel.passes import accumulation_loop
from epl.parallel.passes import cross_stage_weights
from epl.parallel.passes.context import Accumulation
from epl.parallel.passes.training_subgraph import tensors_of
from epl.parallel.plan.decisions import Decision, MicroBatching, Reduction

logger = logging.getLogger("epl")


def _creates_state(op):
  """Variables, tables and other resources: one per replica, not per
  micro-batch."""
  return "shared_name" in op.node_def.attr


def _micro_batch_ops(ctx, subgraph, points):
  """The ops of the cloned subgraph that run once per micro-batch.

  Input reads, forward ops, and the backward ops the accumulated gradients
  depend on; not variables (nor other resources), not the optimizer, not
  gradient post-processing. In the order of `subgraph.cloned`.
  """
  cloned = subgraph.cloned_names
  backward = set()
  stack = [t.op for grad in points for t in tensors_of(grad)]
  while stack:
    op = stack.pop()
    if op.name in backward or op.name not in cloned:
      continue
    backward.add(op.name)
    stack.extend(graph_editor.input_ops(op))
  selected = []
  for op in subgraph.cloned:
    phase = ctx.state.phase_of(op)
    if op.type in INPUT_READ_TYPES:
      selected.append(op)
    elif _creates_state(op):
      continue
    elif phase is Phase.FORWARD or (phase is Phase.BACKWARD and
                                    op.name in backward):
      selected.append(op)
  return selected


def shared_constants(ops):
  """{name: op} of the constants among `ops` that every micro-batch reads
  as they are: those without control inputs (a constant that waits for
  nothing holds the same value in every copy on the same device).

  Copying them would add a third of a micro-batch's ops (shapes, axes,
  gradient scales) for TensorFlow to place and optimise, only for
  grappler's common-subexpression pass to merge them again.
  """
  return {op.name: op for op in ops
          if op.type == "Const" and not op.control_inputs}


def _accumulate(ctx, grad, copies, built):
  """Sum (or mean) of `grad` and its micro-batch `copies`, on grad's device.

  Dense gradients are added one micro-batch at a time, so that each copy
  can be freed as soon as it is added; IndexedSlices are concatenated. The
  ops built are tagged and appended to `built`.
  """
  mean = ctx.plan.decisions.reduction.value is Reduction.MEAN
  source = tensors_of(grad)[0].op
  taskgraph = ctx.state.taskgraph_of(source)
  count = len(copies) + 1

  def keep(tensor, micro_batch=None):
    ctx.state.tag(tensor.op, taskgraph, Phase.BACKWARD, micro_batch)
    built.append(tensor.op)
    return tensor

  def scaled(tensor):
    if not mean:
      return tensor
    divisor = keep(tf.constant(count, dtype=tensor.dtype, name="micro_batches"))
    return keep(tf.math.truediv(tensor, divisor, name="mean"))

  with tf.device(source.device), tf.name_scope(source.name):
    if isinstance(grad, tf.IndexedSlices):
      axis = keep(tf.constant(0, name="axis"))

      def concatenated(parts, name):
        # The rows of every micro-batch go where one micro-batch's flowed:
        # a static row count would no longer match.
        whole = keep(tf.raw_ops.ConcatV2(values=parts, axis=axis, name=name))
        return keep(graph_editor.with_unknown_sizes(whole))
      values = concatenated([grad.values] + [c.values for c in copies],
                            "values")
      indices = concatenated([grad.indices] + [c.indices for c in copies],
                             "indices")
      return tf.IndexedSlices(scaled(values), indices, grad.dense_shape)
    total = grad
    for micro_batch, copy in enumerate(copies, 1):
      total = keep(tf.math.add(total, copy, name="add_%d" % micro_batch),
                   micro_batch)
    return scaled(total)


def _accumulate_on_devices(ctx, grad, readers, copies, built):
  """`_accumulate` of `grad` and its copies in `copies` ({name: copy}
  per further micro-batch); a gradient summed from parts on other devices
  than its `readers` (outside the micro-batches) has each part summed on
  its device first (`cross_stage_weights`)."""
  found = cross_stage_weights.parts_on_other_devices(ctx, grad, readers)
  if found is None:
    return _accumulate(ctx, grad, [_copy_of(grad, c) for c in copies], built)
  parts, where = found
  sums = [_accumulate(ctx, part, [_copy_of(part, c) for c in copies], built)
          for part in parts]
  return cross_stage_weights.sum_parts(ctx, grad, where, sums, copies, built)


def _copy_of(grad, clones):
  def tensor(t):
    return clones[t.op.name].outputs[t.value_index]
  if isinstance(grad, tf.IndexedSlices):
    return tf.IndexedSlices(tensor(grad.values), tensor(grad.indices),
                            grad.dense_shape)
  return tensor(grad)


def _copies_per_micro_batch(ctx, ops, user_devices):
  """[{name: copy}] of `ops` (in replica 0) for micro-batches 1..M-1,
  named `EPL_MICRO_BATCH_<m>/<name>` on the same devices, with the tags,
  provenance and user devices of their originals."""
  state = ctx.state
  cloner = graph_editor.Cloner(ctx.graph, ops)
  result = []
  for micro_batch in range(1, ctx.plan.num_micro_batch):
    prefix = names.micro_batch_prefix(micro_batch)
    clones = cloner.clone(prefix, lambda op: op.device,
                          provenance=state.provenance,
                          replica=ctx.replicas[0], micro_batch=micro_batch)
    state.copy_tags_to_copies(clones, prefix, micro_batch)
    for name in clones:
      user_devices[prefix + name] = user_devices.get(name, "")
    result.append(clones)
  return result


def _with_accumulated(gradient_points, accumulated):
  """`gradient_points` with each gradient of `accumulated` ({name of its
  first tensor: sum}) replaced by its sum."""
  return [[(accumulated.get(tensors_of(grad)[0].name, grad), var)
           for grad, var in record_points]
          for record_points in gradient_points]


def _accumulate_in_loop(ctx, loop_layout, subgraph, gradient_points, result):
  with ctx.building():
    read_copies = _copies_per_micro_batch(ctx, loop_layout.reads,
                                          result["user_devices"])
    built, accumulated = accumulation_loop.run_as_loop(
        ctx, loop_layout, result["copies"], read_copies)
    built = [op for clones in read_copies for op in clones.values()] + built
  result["copies"].clones[0].update({op.name: op for op in built})
  result["subgraph"] = subgraph.adding(built)
  result["gradient_points"] = _with_accumulated(gradient_points, accumulated)
  return result


def _micro_batch_zero(ctx, subgraph, gradients, copies):
  """Tags the ops of one micro-batch as micro-batch 0 (input reads become
  FORWARD) and records them as `copies.micro_batches[0]`; returns the
  gradients to accumulate by point name and those ops."""
  state = ctx.state
  points = collections.OrderedDict()
  # The gradients tf.gradients made, so that post-processing (clipping)
  # sees the accumulated gradient, as it would see the gradient of one big
  # batch.
  for grad in gradients.raw_gradients():
    points.setdefault(tensors_of(grad)[0].name, grad)
  selected = _micro_batch_ops(ctx, subgraph, list(points.values()))
  for op in selected:
    if op.type in INPUT_READ_TYPES:
      state.set_phase(op, Phase.FORWARD)
    state.set_micro_batch(op, 0)
  copies.micro_batches = [{op.name: op for op in selected}]
  return points, selected


def _sum_copies(ctx, subgraph, points, selected_names, copies, built):
  """Sums each gradient over the micro-batches' copies; its readers in the
  subgraph read the sum. Returns the sums by point name."""
  accumulated = {}
  with ctx.building(names.MICRO_BATCH_ACCUMULATION):
    for name, grad in points.items():
      if tensors_of(grad)[0].op.name not in selected_names:
        continue
      readers = [(tensor, [c for c in tensor.consumers()
                           if c.name in subgraph.cloned_names and
                           c.name not in selected_names])
                 for tensor in tensors_of(grad)]
      grads = [_copy_of(grad, clones) for clones in copies.micro_batches[1:]]
      first_built = len(built)
      total = _accumulate_on_devices(
          ctx, grad, [op for _, ops in readers for op in ops],
          copies.micro_batches[1:], built)
      copies.accumulations[tensors_of(total)[0].name] = Accumulation(
          [grad] + grads, built[first_built:])
      for (old, consumers), new in zip(readers, tensors_of(total)):
        graph_editor.replace_input_in(consumers, old, new)
      accumulated[name] = total
  return accumulated


def _accumulate_copies(ctx, subgraph, selected, points, gradient_points,
                       result):
  """Runs the micro-batches as copies of `selected` (constants shared) and
  sums their gradients."""
  copies = result["copies"]
  selected_names = {op.name for op in selected}
  constants = dict(shared_constants(selected),
                   **cross_stage_weights.reads_of_other_devices(ctx, selected))
  built = []
  for clones in _copies_per_micro_batch(
      ctx, [op for op in selected if op.name not in constants],
      result["user_devices"]):
    built.extend(clones.values())
    clones.update(constants)
    copies.micro_batches.append(clones)
  accumulated = _sum_copies(ctx, subgraph, points, selected_names, copies,
                            built)
  copies.clones[0].update({op.name: op for op in built})
  result["subgraph"] = subgraph.adding(built)
  result["gradient_points"] = _with_accumulated(gradient_points, accumulated)
  return result


def clone_micro_batches(ctx, subgraph, gradients, gradient_points, copies,
                        user_devices):
  """Makes replica 0 run pipeline.num_micro_batch (M) micro-batches a step.

  The ops of one micro-batch (input reads, forward ops, and the backward
  ops up to the gradients; not variables, not the optimizer, not gradient
  post-processing) get M - 1 copies named `EPL_MICRO_BATCH_<m>/<name>`, on
  the same devices; each reads its own batch from the input pipeline (the
  copies of an input read). Constants that wait for nothing are not copied:
  every micro-batch reads micro-batch 0's (`shared_constants`), nor reads
  of a variable on another device (`cross_stage_weights`): the copies map them
  to themselves. Each gradient is summed over the micro-batches on its
  stage's device (parts from other devices on theirs first; divided by M
  when communication.gradients_reduce_method is "mean"), and the ops that read
  it (post-processing, the optimizer) read the accumulated gradient
  instead; the gradient points handed on follow, and `copies.accumulations`
  records each sum's parts and ops. The new ops join the
  cloned subgraph, so that every replica gets them; the copies are
  recorded in the provenance.

  When the plan decided a loop (`plan.decisions.micro_batches`),
  the micro-batches run as a loop instead of copies
  (`epl.parallel.passes.accumulation_loop`): only the input reads get M - 1
  copies, and the gradients handed on are the loop's sums. What cannot run
  in the loop falls back to copies with a warning naming the op. Hands on
  how they run, and why (`micro_batching`).

  Tags each op of a micro-batch with its index (the user's ops are
  micro-batch 0; input reads become FORWARD), also when M is 1, which
  changes nothing else. Variables, the optimizer and every op outside the
  training step keep their names, inputs and devices.
  """
  count = ctx.plan.num_micro_batch
  points, selected = _micro_batch_zero(ctx, subgraph, gradients, copies)
  decision = ctx.plan.decisions.micro_batches
  result = {"subgraph": subgraph, "gradient_points": gradient_points,
            "copies": copies, "user_devices": user_devices,
            "micro_batching": decision}
  if count == 1:
    return result
  reason = None
  if decision.value is MicroBatching.LOOP:
    loop_layout = accumulation_loop.layout(ctx, subgraph, selected, points)
    reason = loop_layout.reason_for_copies()
    if reason is None:
      return _accumulate_in_loop(ctx, loop_layout, subgraph, gradient_points,
                                 result)
    result["micro_batching"] = Decision(
        MicroBatching.COPIES, "op %r %s" % reason, asked=MicroBatching.LOOP)
  elif decision.asked is MicroBatching.LOOP:
    reason = ("", decision.reason)
  if reason is not None:
    logger.warning(
        "EPL: the %d micro-batches of a step run as %d copies of the "
        "forward and backward pass, not as a loop (pipeline.accumulation "
        "\"loop\"): %s %s. Set pipeline.accumulation to \"copies\" to "
        "choose copies.", count, count,
        ("op %r" % reason[0]) if reason[0] else "the step", reason[1])
  return _accumulate_copies(ctx, subgraph, selected, points, gradient_points,
                            result)
