"""ZeRO v3 (zero.level "v3"): partitioned weights, gathered just before use.

Each partitioned variable of a TaskGraph (pipeline stage) is stored as N
shards along its first axis, one per replica of this worker (N = the
local replicas; shard r on replica r's device of that stage): `columns`
= ceil(rows / N) rows each, the last shards padded with zero rows. No
replica keeps the whole weight. Its optimizer slots (variables of the same
shape that its update built) are sharded alike, so a replica holds 1/N of
the weights, slots and reduced gradients.

- Forward and backward: every use of the weight in a replica's step
  reads an all-gather of the shards over the worker's replicas, made for
  that use alone and started zero.prefetch_layers uses ahead
  (`zero_gathers`), so the full weight exists only around the op that
  needs it (backward gathers again instead of keeping the forward's
  copy). Shape, Size and Rank of the weight read constants;
  VariableShape too; ResourceGather gathers rows from the full weight.
- Gradients (reduce-scatter): shard r's gradient is the sum over
  replicas (and, where the micro-batch sum is the update's alone, over
  micro-batches, as v2) of those rows of each replica's gradient, made on
  shard r's device from the layer's inputs where the plan chose that
  route for a kernel's MatMul (it moves fewer bytes there:
  `epl.parallel.plan.gradient_shards`), else made (or sliced) on the
  replica that made the gradient and summed on shard r's device
  (`zero_gradient_shards`); each
  replica's update (its clone of the optimizer's ops) applies its shard's
  gradient to its shard and slots. The updates must be elementwise: the
  fused apply kernels of the tf.compat.v1.train optimizers, or elementwise
  ops on the variable, its slots, its gradient and scalars (Google BERT's
  AdamW); no norm of the whole variable (LAMB, LARS).
- Initial values, restores and other whole-value assignments outside the
  step: the value is computed once, whole (random initializers give what
  single-device TF gives); each replica writes its slice
  (`split_checkpoint.write_shards`). Other writes raise.
- Checkpoints: each variable is saved as one full tensor under its own name
  and restored slice by slice (`split_checkpoint.full_tensor_checkpoints`),
  so checkpoints go both ways between v3 and plain TF. Fetching the user's
  variable (or a read of it made outside the step) returns the full value.

Which variables are partitioned is the plan's decision
(`epl.parallel.plan.weight_partition`, printed by epl-plan). Variables left
whole (treated as v2: one owner holds slots and applies the update): those
with fewer than zero.min_partition_size elements, scalars, those with
sparse (IndexedSlices) gradients and those whose update is not elementwise
(EPL warns for the last two). Replicas partitioned are
those of one worker: across workers, the k-th replica of every worker holds
the same shard, their shard gradients are all-reduced, and worker 0's
initial shards are broadcast to them.
"""
import contextlib
import dataclasses
import logging
from typing import Dict, List

import tensorflow as tf

from epl.ir import graph_editor
from epl.ir import names as epl_names
from epl.ir import variables
from epl.ir.op_types import (SHAPE_READER_TYPES, VARIABLE_ASSIGN_TYPES,
                             VARIABLE_READ_TYPES, VARIABLE_TYPES)
from epl.parallel.ops.split_lowering import ShardedVariable
from epl.parallel.passes import across_workers
from epl.parallel.passes import zero_gathers
from epl.parallel.passes import zero_gradient_shards
from epl.parallel.passes.split_checkpoint import (full_tensor_checkpoints,
                                                  write_shards)
from epl.parallel.passes.training_subgraph import is_variable_writer
from epl.parallel.passes.variable_sync import assign_value, read_value
from epl.parallel.plan.decisions import Reduction
from epl.parallel.plan.gradient_shards import GradientShards
from epl.parallel.plan.weight_partition import WeightSharding

logger = logging.getLogger("epl")

@dataclasses.dataclass
class ShardedWeights:
  """v3's partitioned variables and what the rewrite built for them.

  `shards`: {variable op name: ShardedVariable} of the partitioned weights
  and their slots (user's names); `points`: the (gradient, variable) pairs
  of the partitioned weights; `updates`: {weight name: its update ops};
  `full_shapes`: {variable op name: its unsharded shape}; `reduced`:
  {weight name: [its shard gradient on each local replica]};
  `writes`: {name of a write of the full value (initializer, restore):
  the shard writes added for it}; `shard_inputs`: {name of the value such
  a write now writes, replica 0's slice: (write name, variable name)};
  `gathered`: names of the reads outside the step already
  given the full value.
  """
  shards: Dict[str, ShardedVariable]
  points: list
  updates: Dict[str, List[tf.Operation]]
  full_shapes: Dict[str, tf.TensorShape]
  reduced: Dict[str, list] = dataclasses.field(default_factory=dict)
  writes: Dict[str, list] = dataclasses.field(default_factory=dict)
  shard_inputs: Dict[str, tuple] = dataclasses.field(default_factory=dict)
  gathered: set = dataclasses.field(default_factory=set)


def _warn_left_whole(partition):
  """Warns for the variables the plan's WeightPartition left whole because
  of sparse gradients or updates that are not elementwise; logs the small
  ones."""
  sparse = partition.names(WeightSharding.SPARSE)
  if sparse:
    logger.warning(
        "zero.level v3: %s get sparse gradients (embedding lookups); they "
        "stay whole on every replica, their optimizer state and gradients "
        "partitioned as with v2.", ", ".join(sparse))
  other = ["%s (%s)" % (name, partition.of(name).reason) for name in
           partition.names(WeightSharding.NOT_ELEMENTWISE)]
  if other:
    logger.warning(
        "zero.level v3: the updates of %s are not elementwise, so they "
        "cannot apply shard by shard; those variables stay whole, their "
        "optimizer state and gradients partitioned as with v2.",
        ", ".join(other))
  small = partition.names(WeightSharding.SMALL)
  if small:
    logger.info("zero.level v3: %d variable(s) under zero.min_partition_size "
                "stay whole: %s", len(small), ", ".join(small))


def _variables_of_update(variable, update, trained):
  """`variable` and the variable ops of its `update` ops: those among
  them, and the untrained ones only they use (its slots: a traced TF2
  step's slots are variables of the stage that the update reads)."""
  names = {op.name for op in update}
  found = [variable] + [op for op in update if op.type in VARIABLE_TYPES]
  found += [t.op for op in update for t in op.inputs
            if t.op.type in VARIABLE_TYPES and t.op.name not in trained and
            all(c.name in names for c in t.consumers())]
  return list(dict.fromkeys(found))


def choose_sharded(ctx, points, updates):
  """The ShardedWeights of the trained variables the plan partitions
  (`ctx.plan.decisions.partition`), among `points` ((gradient, variable)
  pairs) whose `updates` ({variable name: update ops}) are known; None
  when it partitions none."""
  partition = ctx.plan.decisions.partition
  _warn_left_whole(partition)
  chosen = set(partition.names(WeightSharding.PARTITIONED))
  trained = {name for name, _ in partition.variables}
  replicas = len(ctx.replicas)
  shards, sharded_points, full_shapes = {}, [], {}
  for grad, variable in points:
    if variable.name not in chosen:
      continue
    if variable.name not in updates:
      raise RuntimeError(
          "zero.level v3: the plan partitions %r, but the rewrite found no "
          "update of its own for it; please report this." % variable.name)
    shape = tf.TensorShape(variable.get_attr("shape"))
    rows = shape.as_list()[0]
    info = ShardedVariable(axis=0, full_size=rows,
                           columns=-(-rows // replicas), group_size=replicas)
    sharded_points.append((grad, variable))
    for op in _variables_of_update(variable, updates[variable.name],
                                   trained):
      if tf.TensorShape(op.get_attr("shape")) == shape:
        shards[op.name] = info
        full_shapes[op.name] = shape
  if not sharded_points:
    logger.warning(
        "zero.level v3 partitions no variable (zero.min_partition_size = "
        "%d elements); it works as v2. Lower zero.min_partition_size to "
        "partition smaller variables.", partition.min_partition_size)
    return None
  return ShardedWeights(
      shards=shards, points=sharded_points,
      updates={v.name: updates[v.name] for _, v in sharded_points},
      full_shapes=full_shapes)


def _shard_of(local, group_size):  # pylint: disable=unused-argument
  """Local replica `local` holds shard `local` (of every worker's group)."""
  return local


def _set_shard_shapes(ctx, copies, weights):
  """Every local copy of each partitioned variable is declared with its
  shard's shape (its values come from its initializer's slice)."""
  for name, info in weights.shards.items():
    variable = ctx.graph.get_operation_by_name(name)
    shape = weights.full_shapes[name].as_list()
    shape[info.axis] = info.columns
    for local in range(len(ctx.replicas)):
      graph_editor.set_attr(copies.op(local, variable), "shape",
                          tf.compat.v1.AttrValue(
                              shape=tf.TensorShape(shape).as_proto()))


def _constant_for(kind, out_type, device, shape):
  """A constant of what a `kind` op (Shape, Size or Rank; VariableShape is
  a Shape) with `out_type` says of a tensor of `shape`."""
  with tf.device(device):
    if kind in ("Shape", "VariableShape"):
      return tf.constant(shape.as_list(), out_type)
    if kind == "Size":
      return tf.constant(shape.num_elements(), out_type)
    return tf.constant(shape.rank, tf.int32)


def _read_constant(op, shape):
  """Replaces what Shape, Size, Rank or VariableShape op `op` gives its
  readers by a constant of the full `shape`."""
  out_type = op.get_attr("out_type") if op.type != "Rank" else tf.int32
  graph_editor.replace_input_in(
      list(op.outputs[0].consumers()), op.outputs[0],
      _constant_for(op.type, out_type, op.device, shape))


def _uses_of(ctx, copies, weights, name):
  """The Uses of partitioned weight `name` in replica 0's step (the ops
  that read it, or take rows of it); Shape, Size, Rank and VariableShape
  of it in every local replica's step read constants instead. Raises for
  any other use."""
  variable = ctx.graph.get_operation_by_name(name)
  shape = weights.full_shapes[name]
  uses = []
  for local in range(len(ctx.replicas)):
    replica_names = copies.replica_op_names(local)
    update_names = {copies.op(local, op).name
                    for op in weights.updates[name]}
    copy = copies.op(local, variable)
    for reader in list(dict.fromkeys(copy.outputs[0].consumers())):
      if reader.name not in replica_names or reader.name in update_names:
        continue
      if reader.type in VARIABLE_READ_TYPES:
        for consumer in list(dict.fromkeys(reader.outputs[0].consumers())):
          if consumer.type in SHAPE_READER_TYPES and consumer.type != "ShapeN":
            _read_constant(consumer, shape)
          elif consumer.name not in replica_names:
            # An op outside the step (one a pass replaced, or the user's
            # own) reads the full weight too, without a collective.
            graph_editor.replace_input_in(
                [consumer], reader.outputs[0], zero_gathers.concatenated(
                    ctx, copies, variable, weights.shards[name],
                    consumer.device))
          elif local == 0:
            uses.append(zero_gathers.Use(name, consumer, reader.outputs[0]))
      elif reader.type == "VariableShape":
        _read_constant(reader, shape)
      elif reader.type == "ResourceGather" and not reader.get_attr(
          "batch_dims"):
        if local == 0:
          uses.append(zero_gathers.Use(name, reader, copy.outputs[0],
                                       rows=True))
      else:
        raise ValueError(
            "zero.level v3: op %r (%s) of the training step uses variable "
            "%r in a way EPL cannot build from its shards. Raise "
            "zero.min_partition_size above its %d elements to keep it "
            "whole, or use zero.level 'v2'." % (
                reader.name, reader.type, name, shape.num_elements()))
  return uses


def _leaving_readers(ctx, copies, weights, accumulation, name):
  """Names of the ops that read a replica's gradient of weight `name` now
  and will not once it is reduce-scattered: every local replica's update
  and the micro-batch sum (`accumulation`) the shards build instead."""
  leaving = {copies.op(local, op).name for local in range(len(ctx.replicas))
             for op in weights.updates[name]}
  if accumulation:
    leaving.update(op.name for op in accumulation.ops)
  return leaving


def _summed_from_activations(ctx, tensors, info, leaving, devices, name):
  """Where the plan makes the shard gradients of weight `name` from the
  replicas' activations, [shard s's summed gradient on `devices[s]`] of
  its gradients `tensors` (`zero_gradient_shards.summed_shards`); else
  None."""
  route = ctx.plan.decisions.partition.route_of(name).decision
  if route.value is not GradientShards.FROM_ACTIVATIONS:
    return None
  summed = zero_gradient_shards.summed_shards(tensors, info, leaving,
                                              devices)
  if summed is None:
    raise RuntimeError(
        "zero.level v3: the plan makes the shard gradients of %r from the "
        "replicas' activations (%s), but the rewritten step's gradient of "
        "it is not a kernel's MatMul that only its update reads; please "
        "report this." % (name, route.reason))
  return summed


def _reduce_scatter(ctx, copies, weights, accumulations, name, grad):
  """Shard r's gradient: the sum of slice r of every replica's gradient
  (of every micro-batch where `accumulations` has the weight's sum),
  made where each was made (`zero_gradient_shards`) and summed on shard
  r's device; replica r's update reads it."""
  mean = ctx.plan.decisions.reduction.value is Reduction.MEAN
  variable = ctx.graph.get_operation_by_name(name)
  info = weights.shards[name]
  rank = weights.full_shapes[name].rank
  accumulation = accumulations.get(name)
  parts = accumulation.parts if accumulation else [grad]
  taskgraph = ctx.taskgraph_index(variable)
  leaving = _leaving_readers(ctx, copies, weights, accumulation, name)
  members = range(len(ctx.replicas))
  with tf.name_scope("reduce_scatter/%s" % name):
    summed = _summed_from_activations(
        ctx, [copies.tensor(l, part) for part in parts for l in members],
        info, leaving, [ctx.device(shard, taskgraph) for shard in members],
        name)
    sliced = {} if summed else {
        (index, local): zero_gradient_shards.shards_of(
            copies.tensor(local, part), info, rank, leaving)
        for index, part in enumerate(parts) for local in members}
  reduced = []
  for shard in members:
    replicas = [shard] + [l for l in members if l != shard]
    pieces = [summed[shard]] if summed else [
        sliced[(index, local)][shard] for index in range(len(parts))
        for local in replicas]
    with tf.name_scope("reduce_scatter/%s" % name):
      with tf.device(ctx.device(shard, taskgraph)):
        total = pieces[0]
        for piece in pieces[1:]:
          total = total + piece
        if across_workers.spans_workers(ctx):
          # The same shard of every worker: the k-th replica of each.
          total = across_workers.peer_communicator(
              ctx, shard, taskgraph).all_reduce([total], "sum")[0]
        if mean:
          total = total / (ctx.plan.num_replicas * len(parts))
        # The update's gradient input has the full static shape.
        shaped = graph_editor.with_unknown_sizes(total)
    old = copies.tensor(shard, grad)
    update_names = {copies.op(shard, op).name
                    for op in weights.updates[name]}
    graph_editor.replace_input_in(graph_editor.consumers_of(old, update_names),
                                  old, shaped)
    reduced.append(total)
  weights.reduced[name] = reduced


def _from_worker_zero(ctx, copies, variable, writes):
  """Across workers: once `writes` wrote each local shard of `variable`
  (in local replica order), worker 0's shards are broadcast to the same
  replica of every other worker, which writes them: every worker starts
  from worker 0's values, also from unseeded random initializers. Returns
  the ops that end it on this worker (worker 0: the sends)."""
  taskgraph = ctx.taskgraph_index(variable)
  on_worker_zero = ctx.cluster.worker_index == ctx.plan.device_workers[0][0]
  ends = []
  for local, write in enumerate(writes):
    shard = copies.op(local, variable)
    with tf.control_dependencies([write]):
      # TensorFlow still knows the shard by the variable's full static
      # shape: the receivers take the shape of their own shard at run time.
      value = graph_editor.with_unknown_sizes(read_value(shard))
    with tf.device(shard.device):
      received = across_workers.broadcast_from_worker_zero(
          across_workers.peer_communicator(ctx, local, taskgraph), value)
    ends.append(received.op if on_worker_zero else assign_value(
        shard, graph_editor.with_unknown_sizes(received), name=None))
  return ends


def _whole_writes(ctx, copies, weights, substitutes):
  """Writes of a full value into the user's copy of a partitioned variable
  outside the step (its initializer, a Saver's restore, `var.load`) write
  every local replica's slice instead (`write_shards`: the ops grouping
  the write wait for every slice; fetching the write alone writes them
  too, `substitutes`). The initializer computes the full value once, so
  random initializers give what single-device TF gives; across workers,
  worker 0's initial shards are then broadcast. Raises for other writes
  (assign_add, scatter): they would need a slice of their operand."""
  step = copies.replica_op_names(0)
  for name, info in weights.shards.items():
    variable = ctx.graph.get_operation_by_name(name)
    for writer in list(variable.outputs[0].consumers()):
      if (writer.name in step or not is_variable_writer(writer) or
          ctx.state.provenance.built_by_rewrite(writer)):
        continue
      if writer.type not in VARIABLE_ASSIGN_TYPES:
        raise ValueError(
            "zero.level v3: op %r (%s) writes partitioned variable %r "
            "outside the training step; EPL slices only whole-value "
            "assignments into its shards. Assign the whole new value, or "
            "raise zero.min_partition_size above its %d elements." % (
                writer.name, writer.type, name,
                weights.full_shapes[name].num_elements()))
      writes = weights.writes.get(writer.name)
      if writes is None:
        groups = graph_editor.control_outputs(writer)
        writes = write_shards(ctx, copies, writer, info, _shard_of)
        # Only across workers: finding the initializer reads every
        # collection of the graph.
        if across_workers.spans_workers(ctx) and (
            writer is variables.initializer(variable)):
          writes = _from_worker_zero(ctx, copies, variable, [writer] + writes)
          for group in groups:
            graph_editor.add_control_inputs(group, writes)
        weights.writes[writer.name] = writes
        weights.shard_inputs[writer.inputs[1].name] = (writer.name, name)
        with tf.control_dependencies([writer] + writes):
          substitutes[writer.name] = tf.group(writer, *writes)
          for output in writer.outputs:
            substitutes[output.name] = zero_gathers.concatenated(
                ctx, copies, variable, info, variable.device)
        continue
      # Groups the user built since (the rewrite's own reads of a written
      # shard wait for the write too: they are not groups).
      for group in graph_editor.control_outputs(writer):
        if not ctx.state.provenance.built_by_rewrite(group):
          graph_editor.add_control_inputs(group, writes)


def _reads_outside_the_step(ctx, copies, weights):
  """[(variable name, read tensor)]: the user's reads of the user's copy
  of each partitioned variable outside the step not given the full value
  yet (a reference variable's own output counts). Found before the
  rewrite builds more reads: its own are not recorded as its own until
  the pass ends."""
  step = copies.replica_op_names(0)
  found = []
  for name in weights.shards:
    variable = ctx.graph.get_operation_by_name(name)
    reads = [op.outputs[0] for op in variable.outputs[0].consumers()
             if op.type in VARIABLE_READ_TYPES and op.name not in step and
             not ctx.state.provenance.built_by_rewrite(op)]
    if graph_editor.is_ref_dtype(variable.outputs[0].dtype):
      reads.append(variable.outputs[0])
    found.extend((name, read) for read in reads
                 if read.name not in weights.gathered)
  return found


def _full_reads_outside_the_step(ctx, copies, weights, reads, substitutes):
  """`reads` ([(variable name, read)]) give the full value: a fetch of one
  gets the gathered value instead (`substitutes`), and ops that read one
  outside the step (Savers excepted: full_tensor_checkpoints writes full
  tensors) read it."""
  step = copies.replica_op_names(0)
  for name, read in reads:
    variable = ctx.graph.get_operation_by_name(name)
    weights.gathered.add(read.name)
    # A read made after a write (what `assign` returns) reads every shard
    # after the write and its slices.
    waits = list(read.op.control_inputs) if read.op is not variable else []
    for write in list(waits):
      waits.extend(weights.writes.get(write.name, []))
    full = zero_gathers.concatenated(
        ctx, copies, variable, weights.shards[name], variable.device, waits)
    substitutes[read.name] = full
    if read.op is variable:
      continue
    for consumer in list(read.consumers()):
      if consumer.type != "SaveV2" and consumer.name not in step:
        graph_editor.replace_input_in([consumer], read, full)


@contextlib.contextmanager
def _building(ctx):
  """Ops built here go under `EPL_ZERO_WEIGHTS`, with no control dependency
  or colocation of the caller's, and are not captured."""
  with ctx.building(epl_names.ZERO_WEIGHTS), \
      ctx.graph.colocate_with(None, ignore_existing=True):
    yield


def partition_weights(ctx, zero_partition, subgraph, gradient_points,
                      copies):
  """zero.level v3: makes each local replica's copy of every partitioned
  variable (and of its slots) one shard, after the replicas are cloned.

  Declares the copies with their shard's shape; makes every read of a
  partitioned weight in the step read the weight gathered from its shards
  just before use; replaces each replica's gradient of it, for its
  update, by its shard of the gradient summed over replicas
  (reduce-scatter). Hands on the subgraph without the partitioned variables among
  those replica 0 copies into the others, and the gradient points without
  their gradients (they are not all-reduced). Nothing changes without a
  partition of weights.
  """
  result = {"subgraph": subgraph, "gradient_points": gradient_points}
  weights = zero_partition.weights if zero_partition else None
  if weights is None:
    return result
  with _building(ctx):
    _set_shard_shapes(ctx, copies, weights)
    uses = []
    for grad, variable in weights.points:
      uses.extend(_uses_of(ctx, copies, weights, variable.name))
      _reduce_scatter(ctx, copies, weights, zero_partition.accumulations,
                      variable.name, grad)
    zero_gathers.gather_uses(ctx, copies, weights, uses)
  logger.info(
      "ZeRO v3: %d weight(s) partitioned over %d replicas (%d variables "
      "with slots)", len(weights.points), len(ctx.replicas),
      len(weights.shards))
  taken = {id(grad) for grad, _ in weights.points}
  result["subgraph"] = subgraph.without_variables(set(weights.shards))
  result["gradient_points"] = [[(g, v) for g, v in points
                                if id(g) not in taken]
                               for points in gradient_points]
  return result


def update_after_rewrite(ctx, zero_partition, copies, substitutes):
  """For ops built since the last call (and at the rewrite): whole-value
  writes of partitioned variables outside the step (initializers,
  restores) write every shard (`_whole_writes`), SaveV2 writes full
  tensors, and reads outside the step give the full value; fetches of
  either get `substitutes`. Nothing without partitioned weights."""
  weights = zero_partition.weights if zero_partition else None
  if weights is None:
    return
  reads = _reads_outside_the_step(ctx, copies, weights)
  with _building(ctx):
    _whole_writes(ctx, copies, weights, substitutes)
    full_tensor_checkpoints(ctx, copies, weights.shards, _shard_of)
    _full_reads_outside_the_step(ctx, copies, weights, reads, substitutes)


def translate_whole_values(ctx, zero_partition, copies, substitutes):
  """zero.level v3: outside the training step, partitioned variables are
  written and read as whole values (`update_after_rewrite`).

  Initializers and restores write each replica's slice of the value
  (initial values are computed once, whole), Savers write full tensors,
  and fetching a partitioned variable (or a read of it) returns its full
  value, gathered from its shards (fetch substitutes added); the engine
  does the same for ops built later. Nothing changes without partitioned
  weights.
  """
  update_after_rewrite(ctx, zero_partition, copies, substitutes)
  return {"substitutes": substitutes}


def check_feeds(ctx, feed_dict, zero_partition):  # pylint: disable=unused-argument
  """Raises for a fed value that a whole-value write of a partitioned
  variable now slices (what `Variable.load` feeds): the other replicas
  would keep their old slices."""
  weights = zero_partition.weights if zero_partition else None
  if weights is None or not feed_dict:
    return
  for key in feed_dict:
    fed = weights.shard_inputs.get(getattr(key, "name", key))
    if fed is not None:
      raise ValueError(
          "zero.level v3: the fed tensor %r is what %r writes into one "
          "shard of partitioned variable %r (Variable.load feeds it), so "
          "the other shards would not change. Run an assign of the whole "
          "value instead: session.run(variable.assign(value))." % (
              getattr(key, "name", key), fed[0], fed[1]))
