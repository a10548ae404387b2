"""Loss scaling for float16 AMP (amp.loss_scale): a fixed factor or a
dynamic one.

The gradients exist when the rewrite runs, so the loss is scaled where
`tf.gradients` seeds the backward pass: the `grad_ys` fill of ones it
creates for each loss (recorded by capture as the loss seeds) is
multiplied by the scale, which scales every gradient as `loss * scale`
would. Each raw gradient (before any clipping)
is multiplied by 1/scale again, so clipping, accumulation and the
all-reduce see true gradients.

Dynamic scaling (the default): the scale starts at INITIAL_SCALE; after
INCREMENT_PERIOD steps in a row with finite gradients it is multiplied by
MULTIPLIER; a step with an inf or NaN gradient is skipped (no variable,
slot or `global_step` changes) and the scale is divided by MULTIPLIER (not
below 1). Finiteness is decided on the gradients the optimizer applies,
after the all-reduce, so every replica (and worker) decides alike.
"""
import logging

import tensorflow as tf

from epl.ir import graph_editor
from epl.ir import names as epl_names
from epl.ir.phase import Phase
from epl.parallel.passes.context import remap_pairs
from epl.parallel.passes.training_subgraph import is_variable_writer
from epl.parallel.passes import amp
from epl.parallel.plan.decisions import LossScaling
from epl.tf_compat.ops import control_flow_ops

logger = logging.getLogger("epl")

INITIAL_SCALE = 2.0 ** 15
INCREMENT_PERIOD = 2000
MULTIPLIER = 2.0
SCALE_VARIABLE = epl_names.AMP_LOSS_SCALE + "/loss_scale"
GOOD_STEPS_VARIABLE = epl_names.AMP_LOSS_SCALE + "/good_steps"


class _State:
  """A float32 or int64 scalar on the host that needs no initializer: it
  reads its initial value until first written (variables made after the
  user's init op could otherwise never be initialized)."""

  def __init__(self, name, initial, dtype):
    self.handle = tf.raw_ops.VarHandleOp(dtype=dtype, shape=[],
                                         shared_name=name, name=name)
    with tf.name_scope(name + "_read"):
      self.value = tf.cond(
          tf.raw_ops.VarIsInitializedOp(resource=self.handle),
          lambda: tf.raw_ops.ReadVariableOp(resource=self.handle,
                                            dtype=dtype),
          lambda: tf.constant(initial, dtype))

  def assign(self, value):
    return tf.raw_ops.AssignVariableOp(resource=self.handle, value=value)


def _scale_tensor(ctx):
  """The scale as a tensor on the host: a constant, or the dynamic
  state (created here, read once per step)."""
  with tf.device(ctx.host_device(0)):
    if ctx.plan.decisions.loss_scaling.value is not LossScaling.DYNAMIC:
      return tf.constant(ctx.plan.decisions.loss_scale, tf.float32,
                         name=epl_names.AMP_LOSS_SCALE + "/fixed"), None
    scale = _State(SCALE_VARIABLE, INITIAL_SCALE, tf.float32)
    good_steps = _State(GOOD_STEPS_VARIABLE, 0, tf.int64)
    return scale.value, (scale, good_steps)


def _multiply(ctx, tensor, factor, readers):
  """`readers` read tensor * factor instead; returns the new ops (tagged
  like tensor's op)."""
  with tf.device(tensor.op.device):
    if factor.dtype != tensor.dtype:
      factor = tf.cast(factor, tensor.dtype)
    scaled = tensor * factor
  built = [scaled.op] + ([factor.op] if factor.op.type == "Cast" else [])
  for op in built:
    ctx.state.copy_tags(tensor.op, op)
  graph_editor.replace_input_in(readers, tensor, scaled)
  return scaled, built


def scale_loss(ctx, captured_step, subgraph, gradients, gradient_points,
               copies):
  """Multiplies each `tf.gradients` seed by the loss scale and each raw
  gradient by its inverse (amp.level O1 with float16).

  The seeds are the loss seeds capture recorded, in the cloned subgraph;
  the raw gradients are those `tf.gradients` made; their readers, the
  gradients and the gradient points handed on move to the unscaled
  tensors. The new ops are BACKWARD ops of the TaskGraph of what they
  scale and join the cloned subgraph; the scale itself (a constant or the
  dynamic state) lives on the host and is shared. Hands on the dynamic
  state (`loss_scale_state`), or None.
  """
  seeds = [op for op in subgraph.cloned
           if op.name in captured_step.loss_seeds]
  if not seeds:
    raise ValueError(
        "amp.loss_scale: no gradient seed (the grad_ys fill tf.gradients "
        "makes) was found to scale; gradients passed with explicit grad_ys "
        "cannot be loss-scaled. Use amp.dtype \"bfloat16\", which needs no "
        "loss scale, or let tf.gradients make grad_ys.")
  built = []
  with ctx.building(""):
    scale, dynamic_state = _scale_tensor(ctx)
    for seed in seeds:
      tensor = seed.outputs[0]
      built += _multiply(ctx, tensor, scale, list(tensor.consumers()))[1]
    inverse = tf.math.reciprocal(scale)
    remapped = {}
    for pairs in gradients.raw:
      for grad, _ in pairs:
        tensor = grad.values if isinstance(grad, tf.IndexedSlices) else grad
        if tensor.name in remapped:
          continue
        remapped[tensor.name], ops = _multiply(ctx, tensor, inverse,
                                               list(tensor.consumers()))
        built += ops
  copies.clones[0].update({op.name: op for op in built})
  logger.info("AMP loss scale: %s, %d gradient seed(s) scaled",
              "dynamic" if dynamic_state else ctx.plan.decisions.loss_scale,
              len(seeds))
  return {"subgraph": subgraph.adding(built),
          "gradients": gradients.remapped(remapped),
          "gradient_points": [remap_pairs(points, remapped)
                              for points in gradient_points],
          "copies": copies, "loss_scale_state": dynamic_state}


def _writers(ctx, step, subgraph):
  """The ops of the step that change state: variable updates, slot
  updates, Adam's beta powers, the global_step increment."""
  state = ctx.state
  cloned = [op for op in subgraph.cloned
            if state.phase_of(op) is Phase.APPLY and is_variable_writer(op)]
  shared = [op for op in step.shared
            if state.phase_of(op) is Phase.APPLY and is_variable_writer(op)]
  return cloned, shared


def _gate(op, should_apply):
  """`op` runs only when should_apply is true: one of its value inputs
  passes through a Switch, so otherwise it receives a dead tensor and
  neither runs nor lets ops that wait for it run."""
  for index in reversed(range(len(op.inputs))):
    tensor = op.inputs[index]
    if tensor.dtype != tf.resource and not graph_editor.is_ref_dtype(
        tensor.dtype):
      with tf.device(op.device):
        _, taken = control_flow_ops.switch(tensor, should_apply)
      graph_editor.update_input(op, index, taken)
      return
  raise ValueError("AMP dynamic loss scale cannot skip %s (%s): it has no "
                   "value input to gate." % (op.name, op.type))


def skip_nonfinite_updates(ctx, loss_scale_state, captured_step, subgraph,
                           copies):
  """Skips the step's updates when a gradient is inf or NaN, and updates
  the dynamic scale (after the all-reduce; the state from scale_loss).

  Every replica's state-changing ops of the update (and the shared
  global_step increment) get a Switch on one value input, driven by
  "every float input of replica 0's updates is finite" (the inputs
  computed before any update: gradients, learning rates); the train ops
  also run the scale's update. Nothing else changes.
  """
  scale, good_steps = loss_scale_state
  cloned, shared = _writers(ctx, captured_step, subgraph)
  with ctx.building(epl_names.AMP_LOSS_SCALE + "/"):
    with tf.device(ctx.host_device(0)):
      # Values computed after an update (Adam's beta powers wait for the
      # updates) would make the gates wait for themselves: a cycle.
      after_updates = {op.name for op in graph_editor.descendants(cloned)}
      applied = [t for op in cloned for t in op.inputs
                 if t.dtype.is_floating and
                 not graph_editor.is_ref_dtype(t.dtype) and
                 t.op.name not in after_updates]
      finite = tf.reduce_all(tf.stack(
          [tf.reduce_all(tf.math.is_finite(t)) for t in applied]),
                             name="all_finite")
      grown = good_steps.value + 1
      period_done = grown >= INCREMENT_PERIOD
      new_scale = tf.where(
          finite,
          tf.where(period_done, scale.value * MULTIPLIER, scale.value),
          tf.maximum(scale.value / MULTIPLIER, 1.0))
      new_good = tf.where(finite & tf.logical_not(period_done), grown,
                          tf.zeros_like(grown))
      updates = [scale.assign(new_scale), good_steps.assign(new_good)]
    for local in range(len(ctx.replicas)):
      for op in cloned:
        _gate(copies.op(local, op), finite)
    for op in shared:
      _gate(op, finite)
  for join in captured_step.joins:
    graph_editor.add_control_inputs(join, updates)
  logger.info("AMP dynamic loss scale: %d update op(s) per replica skip "
              "steps with inf/NaN gradients", len(cloned))
