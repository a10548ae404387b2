"""Averaging (or summing) gradients over data-parallel replicas."""
import collections
import logging

import tensorflow as tf

from epl.capture import capture
from epl.ir import control_flow
from epl.ir import graph_editor
from epl.ir import names as epl_names
from epl.ir import pass_through
from epl.ir.phase import Phase
from epl.parallel.passes import gradient_buckets
from epl.parallel.passes.training_subgraph import tensors_of

logger = logging.getLogger("epl")


def _applied_gradients(state, step):
  """{name of a recorded gradient: the gradient apply_gradients applied for
  the same variable}, where exactly one applied gradient descends from it.

  Walks back from each applied gradient through the post-processing
  between (ops that work on gradients), stopping at recorded gradients.
  """
  raw_by_variable = collections.defaultdict(dict)
  raw_ops = set()
  for record in step.gradient_records:
    for grad, variable in record.pairs:
      raw_by_variable[variable.name][tensors_of(grad)[0].op.name] = grad
      raw_ops.update(t.op.name for t in tensors_of(grad))
  matches = collections.defaultdict(list)
  for record in step.apply_records:
    for applied, variable in record.grads_and_vars:
      raw = raw_by_variable.get(variable.name)
      if not raw:
        continue
      stack = [t.op for t in tensors_of(applied)]
      seen = set()
      while stack:
        op = stack.pop()
        if op.name in seen:
          continue
        seen.add(op.name)
        if op.name in raw:
          matches[tensors_of(raw[op.name])[0].name].append(applied)
        if op.name in raw_ops or state.phase_of(op) not in (Phase.BACKWARD,
                                                            Phase.APPLY):
          continue
        stack.extend(graph_editor.input_ops(op))
  return {name: applied[0] for name, applied in matches.items()
          if len(applied) == 1}


def _check_outside_loops(grad, variable):
  """Raises for a gradient computed inside a TF1 while-loop's body: it
  exists once per iteration, and an all-reduce outside the loop cannot
  read it."""
  for tensor in tensors_of(grad):
    if control_flow.value_in_loop(tensor):
      raise ValueError(
          "The gradient of %r is computed inside the TF1 while-loop %r (op "
          "%r): EPL all-reduces gradients outside loops. Call tf.gradients "
          "(or compute_gradients) outside the loop body, or build the loop "
          "with control flow v2 (tf.compat.v1.enable_control_flow_v2())." %
          (variable.name, control_flow.loop_name(tensor.op),
           tensor.op.name))


def select_gradient_points(ctx, captured_step):
  """Chooses the gradients the replicas reduce: the gradient points.

  The (gradient, variable op) pairs to reduce, one list per recorded
  `tf.gradients` call (the `gradient_points` later passes follow).

  By default the gradient as `apply_gradients` applied it, when it did:
  any post-processing between (clipping) runs per replica first, as in the
  original EPL. With communication.clip_after_allreduce, or when no
  `apply_gradients` of the base class applied it (an optimizer that
  overrides it, hand-written updates), the gradient `tf.gradients` made,
  so that everything after it sees the reduced gradient. Each gradient is
  reduced once. Changes nothing in the graph. Raises for a gradient
  computed inside a TF1 while-loop.
  """
  applied = ({} if ctx.config.communication.clip_after_allreduce else
             _applied_gradients(ctx.state, captured_step))
  points, seen, processed = [], set(), []
  for record in captured_step.gradient_records:
    pairs = []
    for grad, variable in record.pairs:
      _check_outside_loops(grad, variable)
      point = applied.get(tensors_of(grad)[0].name, grad)
      if pass_through.behind_identity_n(tensors_of(point)[0]).name != (
          tensors_of(grad)[0].name):
        processed.append(variable.name)
      key = tensors_of(point)[0].name
      if key not in seen:
        seen.add(key)
        pairs.append((point, variable))
    points.append(pairs)
  _warn_processed_per_replica(processed, ctx.plan.num_replicas)
  return {"gradient_points": points}


def _warn_processed_per_replica(variables, num_replicas):
  """Says that the gradients of `variables`, changed between tf.gradients
  and apply_gradients (clipping), are changed per replica before the
  average: a non-linear change (a norm clip) then trains differently from
  one device on the global batch."""
  if variables and num_replicas > 1:
    logger.warning(
        "epl: the gradients of %d variable(s) (%s) are changed between "
        "tf.gradients and apply_gradients (clipping, scaling): each of the "
        "%d replicas changes its own gradient before they are averaged, as "
        "the original EPL did, so a norm clip differs from one device on "
        "the global batch. Set communication.clip_after_allreduce to change "
        "the averaged gradient instead (docs/data_parallel.md).",
        len(variables), ", ".join(sorted(variables)[:3]), num_replicas)


def _remap(copies, local, old, new):
  graph_editor.replace_input_in(
      graph_editor.consumers_of(old, copies.replica_op_names(local)), old, new)


def _float16_all_reduce(communicator, flats, reduce_op, scale,
                        local_devices):
  """All-reduce of float32 `flats` sent as float16 (times `scale`).

  Where the float16 result overflows (inf or NaN), the bucket is sent
  again as float32. The reduced float16 values are the same on every
  replica, so every replica takes the same decision."""
  halves = []
  for local, device in enumerate(local_devices):
    with tf.device(device):
      halves.append(tf.cast(flats[local] * scale, tf.float16))
  reduced = communicator.all_reduce(halves, reduce_op)
  results, overflowed = [], []
  for local, device in enumerate(local_devices):
    with tf.device(device):
      results.append(tf.cast(reduced[local], tf.float32) / scale)
      overflowed.append(tf.logical_not(
          tf.reduce_all(tf.math.is_finite(results[-1]))))
  fallbacks = communicator.all_reduce_where(flats, overflowed, reduce_op)
  for local, device in enumerate(local_devices):
    with tf.device(device):
      results[local] = tf.where(overflowed[local], fallbacks[local],
                                results[local])
  return results


def _reduce_dense_bucket(ctx, copies, communicator, bucket, reduce_op,
                         local_devices):
  """All-reduces the gradients of `bucket`: one gradient as it is, several
  flattened and concatenated into one tensor (then split and reshaped)."""
  comm = ctx.config.communication
  flats = []
  for local, device in enumerate(local_devices):
    with tf.device(device):
      if len(bucket) == 1:
        flats.append(copies.tensor(local, bucket[0]))
      else:
        flats.append(tf.concat([tf.reshape(copies.tensor(local, g), [-1])
                                for g in bucket], 0))
  if comm.fp16 and bucket[0].dtype == tf.float32:
    reduced = _float16_all_reduce(communicator, flats, reduce_op,
                                  comm.fp16_scale, local_devices)
  else:
    reduced = communicator.all_reduce(flats, reduce_op)
  sizes = [g.shape.num_elements() for g in bucket]
  for local, (device, flat) in enumerate(zip(local_devices, reduced)):
    if len(bucket) == 1:
      _remap(copies, local, copies.tensor(local, bucket[0]), flat)
      continue
    with tf.device(device):
      for grad, piece in zip(bucket, tf.split(flat, sizes)):
        replica_grad = copies.tensor(local, grad)
        _remap(copies, local, replica_grad,
               tf.reshape(piece, tf.shape(replica_grad)))


def _padded(tensor, rows):
  """`tensor` with zero rows appended up to `rows` rows."""
  padding = tf.stack([0, rows - tf.shape(tensor)[0]])[None]
  rest = tf.zeros(tf.stack([tf.rank(tensor) - 1, 2]), tf.int32)
  return tf.pad(tensor, tf.concat([padding, rest], 0))


def _gather_rows(ctx, communicator, parts, local_devices):
  """All-gather of tensors whose row counts differ between replicas and
  steps (the rows of an IndexedSlices gradient), as TensorFlow's own
  cross-device code does: every replica's row count is gathered, each
  tensor is padded to the longest, gathered under an instance key of its
  own this step, and the padding is dropped. `parts[local]` are the
  tensors of one local replica (values, indices), with equal row counts;
  returns the gathered lists in the same layout."""
  counts = []
  for local, device in enumerate(local_devices):
    with tf.device(device):
      counts.append(tf.shape(parts[local][0])[:1])
  all_counts = communicator.all_gather(counts)
  padded, masks = [], []
  for local, device in enumerate(local_devices):
    with tf.device(device):
      longest = tf.reduce_max(all_counts[local])
      padded.append([_padded(t, longest) for t in parts[local]])
      masks.append(tf.reshape(tf.sequence_mask(all_counts[local], longest),
                              [-1]))
  step = ctx.step_counter()
  gathered = [communicator.all_gather([p[k] for p in padded], step=step)
              for k in range(len(parts[0]))]
  result = []
  for local, device in enumerate(local_devices):
    with tf.device(device):
      result.append([tf.boolean_mask(g[local], masks[local])
                     for g in gathered])
  return result


def _reduce_sparse(ctx, copies, communicator, grad, reduce_op, local_devices):
  """IndexedSlices: gather every replica's rows (and indices)."""
  values = [copies.tensor(l, grad.values) for l in range(len(local_devices))]
  indices = [copies.tensor(l, grad.indices)
             for l in range(len(local_devices))]
  if tf.compat.dimension_value(grad.values.shape[0]) is not None:
    # A static row count: the same in every replica and step.
    gathered_values = communicator.all_gather(values)
    gathered_indices = communicator.all_gather(indices)
  else:
    gathered = _gather_rows(ctx, communicator, list(zip(values, indices)),
                            local_devices)
    gathered_values = [g[0] for g in gathered]
    gathered_indices = [g[1] for g in gathered]
  for local, device in enumerate(local_devices):
    with tf.device(device):
      new_values = gathered_values[local]
      if reduce_op == "mean":
        new_values = new_values / tf.cast(communicator.group_size,
                                          new_values.dtype)
    _remap(copies, local, values[local], new_values)
    _remap(copies, local, indices[local], gathered_indices[local])


def aggregate_gradients(ctx, gradient_points, copies):
  """Inserts an all-reduce between each replica's gradients and its update.

  For every (gradient, variable) of the gradient points, the ops of
  each replica that read the gradient now read its mean (or sum, per
  communication.gradients_reduce_method) over all replicas. Dense gradients
  of one TaskGraph and dtype travel fused in at most
  communication.max_splits buckets (each alone where the communicator sums
  locally), optionally as float16 with communication.fp16; IndexedSlices
  are all-gathered unless communication.sparse_as_dense made them dense at
  capture. Transfers are built in the order backward makes their gradients
  and dealt round-robin to communication.num_communicators communicators
  (gradient_buckets), so each starts as soon as its gradients exist.
  Nothing else changes; with a single replica this pass does nothing.
  """
  if ctx.plan.num_replicas == 1:
    return
  comm = ctx.config.communication
  # The communicators' name of the plan's reduction ("mean" or "sum").
  reduce_op = ctx.plan.decisions.reduction.value.value
  with ctx.building(epl_names.GRADIENT_AGGREGATION):
    # Each tf.gradients call's gradients reduce in chains of their own, so
    # that a train op run alone never waits on another's all-reduce.
    for chain, points in enumerate(gradient_points):
      by_taskgraph = collections.OrderedDict()
      for grad, _ in points:
        by_taskgraph.setdefault(
            ctx.taskgraph_index(tensors_of(grad)[0].op), []).append(grad)
      transfers = gradient_buckets.plan_transfers(
          by_taskgraph,
          ctx.plan.decisions.max_buckets,
          comm.num_communicators)
      logger.info(
          "EPL gradient aggregation (gradients call %d): %d transfers in "
          "ready order over %d communicator(s), %s", chain, len(transfers),
          min(comm.num_communicators, len(transfers)),
          "fused collectives" if ctx.plan.decisions.max_buckets is not None
          else "local sums")
      logger.debug("EPL gradient transfers (communicator, gradients): %s",
                   [(t.group, len(t.gradients)) for t in transfers])
      for transfer in transfers:
        communicator = ctx.communicator(transfer.taskgraph, chain,
                                        transfer.group)
        devices = [ctx.device(l, transfer.taskgraph)
                   for l in range(len(ctx.replicas))]
        if transfer.sparse:
          _reduce_sparse(ctx, copies, communicator, transfer.gradients[0],
                         reduce_op, devices)
        else:
          _reduce_dense_bucket(ctx, copies, communicator, transfer.gradients,
                               reduce_op, devices)
