"""Gradient checkpointing: recompute activations during backward instead of
keeping them from forward.

`tf.gradients` has already built the backward pass when the rewrite runs, so
recomputation is a rewrite of that backward: every backward op that reads a
forward activation which is neither a checkpoint nor kept for another reason
reads a recomputed copy instead, and the forward value can be freed as soon
as the forward pass no longer needs it. The pass runs on replica 0 before
micro-batches and replicas are cloned, so every micro-batch and replica
inherits it; a recomputed op belongs to the TaskGraph (pipeline stage) of
the op it copies and to the backward pass, so the micro-batch and schedule
passes treat it like the gradient ops that read it.

Checkpoints come from `gradient_checkpoint.type`: "collection" takes the
tensors in `tf.compat.v1.get_collection("checkpoints")`; "auto" takes the
output of each repeated block (`epl.parallel.cost.checkpoint_search`).
"""
import collections
import logging

import tensorflow as tf

from epl.parallel.cost import checkpoint_search
from epl.ir import control_flow
from epl.ir import graph_editor
from epl.ir import names as epl_names
from epl.ir.op_types import SHAPE_READER_TYPES
from epl.ir.phase import Phase
from epl.parallel.plan.decisions import Checkpoints

logger = logging.getLogger("epl")

CHECKPOINTS_COLLECTION = "checkpoints"
# check_gradients tolerance: recomputation may reorder float additions.
_RTOL, _ATOL = 1e-4, 1e-5


def never_recomputed(op):
  """Ops whose forward value is always kept: ops without inputs
  (constants, variables), stateful ops (random ops, so a recomputed
  dropout reuses the forward mask; variable reads; input reads;
  collectives), ops that read a variable by reference, and TF1 control
  flow (a v1 while-loop or cond and the ops in it: the gradient loop
  reads the forward loop's values from stacks the forward loop fills)."""
  if not op.inputs or op.op_def.is_stateful or "Collective" in op.type:
    return True
  if (op.type in control_flow.V1_CONTROL_FLOW_TYPES or
      control_flow.context_of(op) is not None):
    return True
  return any(t.dtype == tf.resource or graph_editor.is_ref_dtype(t.dtype)
             for t in op.inputs)


def checkpoint_tensors(ctx, forward_ops):
  """The checkpoint tensors gradient_checkpoint.type asks for."""
  if ctx.plan.decisions.checkpoints.value is Checkpoints.COLLECTION:
    tensors = [t for t in ctx.graph.get_collection(CHECKPOINTS_COLLECTION)
               if isinstance(t, tf.Tensor)]
    if not tensors:
      raise ValueError(
          "gradient_checkpoint.type is \"collection\" but the collection "
          "%r is empty: add the tensors to keep with tf.compat.v1."
          "add_to_collection(%r, tensor), or use \"auto\"." %
          (CHECKPOINTS_COLLECTION, CHECKPOINTS_COLLECTION))
    return tensors
  end = ctx.config.gradient_checkpoint.end_taskgraph
  return checkpoint_search.search(
      [op for op in forward_ops if not never_recomputed(op) and
       (end < 0 or ctx.taskgraph_index(op) <= end)],
      ctx.config.gradient_checkpoint.min_block_ops)


def _ancestors_within(roots, allowed, stop):
  """Ops of `allowed` reached from `roots` through data inputs, not passing
  through ops of `stop`."""
  seen = set()
  stack = list(roots)
  while stack:
    op = stack.pop()
    if op.name in seen or op.name not in allowed or op.name in stop:
      continue
    seen.add(op.name)
    stack.extend(t.op for t in op.inputs)
  return seen


def _segments(forward, checkpoint_ops, copies):
  """The copies grouped by the checkpoint they lead to: an op belongs to
  the latest checkpoint (in graph order) that its value reaches. An op that
  feeds several layers (an attention mask) goes with the latest, whose
  backward comes first, so each layer is recomputed on its own."""
  forward_names = {op.name for op in forward}
  reaches = {}
  for op in reversed(forward):
    targets = [graph_editor.creation_index(c) if c.name in checkpoint_ops
               else reaches.get(c.name)
               for t in op.outputs for c in t.consumers()
               if c.name in forward_names]
    targets = [t for t in targets if t is not None]
    if targets:
      reaches[op.name] = max(targets)
  for op in forward:
    # A branch that only backward reads (the float32 cast of a half
    # activation) goes with what it is computed from.
    if op.name not in reaches:
      sources = [reaches[t.op.name] for t in op.inputs
                 if t.op.name in reaches]
      if sources:
        reaches[op.name] = max(sources)
  groups = collections.defaultdict(list)
  for name, copy in copies.items():
    groups[reaches.get(name)].append(copy)
  return list(groups.values())


def _descendants(ops):
  """Names of every op downstream of `ops` (data and control edges)."""
  seen = set()
  stack = list(ops)
  while stack:
    op = stack.pop()
    if op.name in seen:
      continue
    seen.add(op.name)
    stack.extend(c for t in op.outputs for c in t.consumers())
    stack.extend(graph_editor.control_outputs(op))
  return seen


def _order_just_in_time(ctx, segment, readers):
  """Makes the first ops of a recomputed `segment` wait for the gradients
  its backward `readers` receive from downstream, so that the segment is
  recomputed when backward reaches it, not at the start of the step."""
  downstream = _descendants(segment)
  inputs = [op for reader in readers for op in graph_editor.input_ops(reader)]
  # A gradient in a loop or a cond branch cannot gate an op outside it.
  conditional = control_flow.conditional_op_names(inputs)
  triggers = {op.name: op for op in inputs
              if ctx.state.phase_of(op) is Phase.BACKWARD and
              op.name not in downstream and op.name not in conditional}
  if not triggers:
    return
  names = {op.name for op in segment}
  for op in segment:
    if not any(t.op.name in names for t in op.inputs):
      graph_editor.add_control_inputs(op, list(triggers.values()))


def _copy_plain_gradients(ctx, backward_ops):
  """A copy of the backward ops that reads the forward values, for
  check_gradients; {original op name: copy}."""
  return graph_editor.clone_ops(ctx.graph, backward_ops,
                                epl_names.GRADIENT_CHECKPOINTS_CHECK,
                                lambda op: op.device,
                                provenance=ctx.state.provenance,
                                replica=ctx.replicas[0])


def _dense(grad):
  return tf.convert_to_tensor(grad) if isinstance(grad, tf.IndexedSlices) \
      else grad


def _add_gradient_checks(step, gradients, plain_copies):
  """Asserts, each step, that every recomputed gradient equals the plain
  one; raises at rewrite time when shapes differ. The step's updates wait
  for the checks: a reference variable's read is no snapshot, so a plain
  gradient computed after an update would read the new weights."""
  def plain(tensor):
    copy = plain_copies.get(tensor.op.name)
    return tensor if copy is None else copy.outputs[tensor.value_index]
  for pairs in gradients.raw:
    checks = []
    for grad, var in pairs:
      if isinstance(grad, tf.IndexedSlices):
        reference = tf.IndexedSlices(plain(grad.values), plain(grad.indices),
                                     grad.dense_shape)
      else:
        reference = plain(grad)
      if not grad.shape.is_compatible_with(reference.shape):
        raise ValueError(
            "gradient_checkpoint.check_gradients: the recomputed gradient of "
            "%s has shape %s, the plain one %s." %
            (var.name, grad.shape, reference.shape))
      actual, expected = _dense(grad), _dense(reference)
      with tf.device(actual.device):
        close = tf.reduce_all(tf.abs(actual - expected) <= _ATOL + _RTOL *
                              tf.abs(expected))
        checks.append(tf.raw_ops.Assert(
            condition=close, summarize=5, data=[
                "gradient_checkpoint.check_gradients: the recomputed "
                "gradient of %s differs from the plain gradient; max "
                "difference:" % var.name,
                tf.reduce_max(tf.abs(actual - expected))]))
    for update in step.updates:
      graph_editor.add_control_inputs(update, checks)


def _recompute_candidates(forward, checkpoints):
  """Names of the forward ops that may be recomputed: those before a
  checkpoint (ancestors of one, or branches off them that only backward
  reads), not checkpoints themselves nor `never_recomputed`."""
  forward_names = {op.name for op in forward}
  checkpoint_ops = {t.op.name for t in checkpoints}
  recomputable = {op.name for op in forward if not never_recomputed(op)}
  before = _ancestors_within(
      [t.op for c in checkpoints for t in c.op.inputs], forward_names,
      stop=())
  for op in forward:
    # Branches off the recomputed part that only backward reads.
    producers = [t.op.name for t in op.inputs]
    if op.name in recomputable and op.name not in checkpoint_ops and any(
        p in before for p in producers) and all(
            p in before or p not in recomputable for p in producers):
      before.add(op.name)
  return (before & recomputable) - checkpoint_ops


def _to_recompute(cloned, backward, candidates):
  """The backward reads [(op, input index, tensor)] of `candidates`, and
  the ops (in `cloned` order) their recomputation copies."""
  # Shape readers run in forward and keep nothing alive: they keep reading
  # the forward value.
  reads = [(op, index, t) for op in backward
           if op.type not in SHAPE_READER_TYPES
           for index, t in enumerate(op.inputs) if t.op.name in candidates]
  needed = _ancestors_within([t.op for _, _, t in reads], candidates,
                             stop=())
  return reads, [op for op in cloned if op.name in needed]


def _check_gradients_possible(ctx, backward):
  """Raises when gradient_checkpoint.check_gradients cannot copy the
  backward pass plainly (a TF1 while-loop in it)."""
  looped = [op.name for op in backward if control_flow.in_loop(op)]
  if looped:
    raise ValueError(
        "gradient_checkpoint.check_gradients cannot check a backward pass "
        "with a TF1 while-loop (op %r, in %r): its plain copy would pop "
        "the forward loop's values a second time. Set "
        "gradient_checkpoint.check_gradients to False (recomputation "
        "itself works), or build the loop with control flow v2 "
        "(tf.compat.v1.enable_control_flow_v2())." % (
            looped[0], control_flow.loop_name(
                ctx.graph.get_operation_by_name(looped[0]))))


def _read_recomputed(ctx, reads, recomputed, copies, user_devices):
  """Makes the backward `reads` read the recomputed copies, which become
  BACKWARD ops of replica 0; returns {copy name: [its backward readers]}."""
  state = ctx.state
  readers = collections.defaultdict(list)
  for op, index, tensor in reads:
    copy = recomputed[tensor.op.name]
    graph_editor.update_input(op, index, copy.outputs[tensor.value_index])
    readers[copy.name].append(op)
  for name, copy in recomputed.items():
    state.copy_tags(copies.clones[0][name], copy)
    state.set_phase(copy, Phase.BACKWARD)
    user_devices[copy.name] = user_devices.get(name, "")
  copies.clones[0].update({copy.name: copy for copy in recomputed.values()})
  return readers


def recompute_activations(ctx, captured_step, subgraph, gradients, copies,
                          user_devices):
  """Rewrites replica 0's backward to recompute non-checkpoint activations.

  Forward ops that lie before a checkpoint (ancestors of one, or branches
  off them that only backward reads) and are not `never_recomputed` get a
  copy named `EPL_GRADIENT_CHECKPOINTS/<name>` on the same device, built
  from the checkpoints and kept values; backward ops that read such an
  op's output read the copy instead (shape readers excepted). Ops after
  the last checkpoints are not recomputed: their gradients come first, so
  recomputing them saves nothing. The copies leading to one checkpoint
  wait (control edges) for the gradients flowing into the backward ops
  that read them. The copies are BACKWARD ops of the original's TaskGraph
  in the cloned subgraph (provenance: what they copy); no other op changes.
  With gradient_checkpoint.check_gradients, the train op also asserts each
  step that the gradients equal those of a plain copy of the backward
  pass. Hands on the recomputed segments (`recomputed_segments`).
  """
  state = ctx.state
  cloned = subgraph.cloned
  forward = [op for op in cloned if state.phase_of(op) is Phase.FORWARD]
  forward_names = {op.name for op in forward}
  backward = [op for op in cloned if state.phase_of(op) is Phase.BACKWARD]
  checkpoints = [t for t in checkpoint_tensors(ctx, forward)
                 if t.op.name in forward_names]
  logger.info("Gradient checkpointing (%s): %d checkpoint tensor(s)",
              ctx.plan.decisions.checkpoints.value.value, len(checkpoints))
  logger.debug("Checkpoints: %s", [t.name for t in checkpoints])
  reads, to_copy = _to_recompute(
      cloned, backward, _recompute_candidates(forward, checkpoints))
  result = {"subgraph": subgraph, "copies": copies,
            "user_devices": user_devices, "recomputed_segments": []}
  if not to_copy:
    logger.warning("Gradient checkpointing: no activation before the "
                   "checkpoints is read by the backward pass; nothing is "
                   "recomputed.")
    return result
  plain_copies = None
  if ctx.config.gradient_checkpoint.check_gradients:
    _check_gradients_possible(ctx, backward)
    plain_copies = _copy_plain_gradients(ctx, backward)
  recomputed = graph_editor.clone_ops(ctx.graph, to_copy,
                                      epl_names.GRADIENT_CHECKPOINTS,
                                      lambda op: op.device,
                                      provenance=state.provenance,
                                      replica=ctx.replicas[0])
  readers = _read_recomputed(ctx, reads, recomputed, copies, user_devices)
  segments = _segments(forward, {t.op.name for t in checkpoints}, recomputed)
  for segment in segments:
    _order_just_in_time(
        ctx, segment, [r for op in segment for r in readers[op.name]])
  logger.info("Gradient checkpointing: %d forward op(s) recomputed in "
              "backward", len(recomputed))
  if plain_copies is not None:
    with ctx.graph.as_default(), ctx.graph.name_scope(
        epl_names.GRADIENT_CHECKPOINTS_CHECK):
      _add_gradient_checks(captured_step, gradients, plain_copies)
  result["subgraph"] = subgraph.adding(recomputed.values())
  result["recomputed_segments"] = segments
  return result
