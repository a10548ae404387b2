"""Turning each replica's copy of a split part into one shard.

`epl.parallel.ops.split_lowering` built the split parts once, as shard 0 of group
0, with placeholder collective keys, and recorded their roles in the
graph's provenance. Replica r of the job is shard r % k of shard group
r // k (k = the split's device count; the groups' replicas are
consecutive). See `lower_split`.
"""
import logging

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from epl.communicators.collective import CollectiveCommunicator
from epl.ir import collectives
from epl.ir import graph_editor
from epl.ir import names as epl_names
from epl.ir import provenance
from epl.ir import variables
from epl.ir.phase import Phase
from epl.parallel.ops import split_lowering
from epl.parallel.passes.split_checkpoint import full_tensor_checkpoints
from epl.parallel.passes.variable_sync import assign_value, read_value
from epl.parallel.plan.decisions import Reduction
from epl.tf_compat.ops import tensor_util

logger = logging.getLogger("epl")

# Seeds of a shard's random initial value: seed2 + shard * this.
_SEED_STRIDE = 7919


def _is_shard_index(op, origins):
  return op.type == "Const" and origins.role_of(op) == provenance.SHARD_INDEX


def _group_size(op):
  return int(tensor_util.constant_value(op.inputs[1]))


def _shard_of(ctx, local, group_size):
  return ctx.replicas[local] % group_size


def _group_devices(ctx, replica, group_size):
  first = replica - replica % group_size
  return [ctx.plan.device(r, 0) for r in range(first, first + group_size)]


def _set_int_const(op, value):
  graph_editor.set_attr(op, "value", attr_value_pb2.AttrValue(
      tensor=tensor_util.make_tensor_proto(value, tf.int32)))


def _set_shard_indices(ops, shard, origins):
  """Shard index consts and per-shard seeds of random initial values."""
  for op in ops:
    if _is_shard_index(op, origins):
      _set_int_const(op, shard)
    elif origins.role_of(op) == provenance.SHARD_RANDOM and (
        "seed2" in op.node_def.attr) and (
            op.get_attr("seed") or op.get_attr("seed2")):
      graph_editor.set_attr(op, "seed2", attr_value_pb2.AttrValue(
          i=op.get_attr("seed2") + shard * _SEED_STRIDE))


def _allocate_group_keys(ctx):
  """Group keys of every shard group of every split size, in one order on
  every worker (a worker asks only for its own groups later)."""
  for taskgraph in ctx.plan.taskgraphs:
    if taskgraph.kind == "split":
      for first in range(0, ctx.plan.num_replicas, taskgraph.device_count):
        ctx.keys.group_key(_group_devices(ctx, first,
                                          taskgraph.device_count))


def _rekey_collectives(ctx, subgraph, copies):
  """Every copy of a lowered collective: its shard group's key and an
  instance key per op and micro-batch, shared by the group's members."""
  _allocate_group_keys(ctx)
  origins = ctx.state.provenance
  lowered = [op for op in subgraph.cloned
             if collectives.is_split_collective(op, origins)]
  rekeyed = set()
  for op in lowered:
    instance_key = ctx.keys.instance_key()
    group_size = _group_size(op)
    for local in range(len(ctx.replicas)):
      copy = copies.op(local, op)
      rekeyed.add(copy.name)
      group_key = ctx.keys.group_key(
          _group_devices(ctx, ctx.replicas[local], group_size))
      with tf.device(copy.device):
        graph_editor.update_input(copy, 2, tf.constant(group_key, tf.int32,
                                          name="group_key"))
        graph_editor.update_input(copy, 3, tf.constant(instance_key, tf.int32,
                                          name="instance_key"))
  return len(lowered)


def _sharded_variables(ctx, subgraph):
  """{variable op name: ShardedVariable} of the split variables and of
  their optimizer slots of the same shape."""
  sharded = {}
  for variable in subgraph.variables:
    info = split_lowering.sharding_of(ctx.graph, variable)
    if info is not None:
      sharded[variable.name] = info
  return sharded


def _initializer(variable):
  assign = variables.initializer(variable)
  if assign is None:
    raise ValueError(
        "Split variable %r has no initializer: no collection of its graph "
        "holds its tf.Variable. Create it with tf.compat.v1.get_variable "
        "or a Keras layer under epl.split." % variable.name)
  return assign


def _initialize_shards(ctx, copies, split_variables, sharded):
  """Each replica's copy of a split variable gets its own shard's initial
  value, and runs wherever the user's initializer runs (the init op's
  group). The first replica of each shard on this worker runs a clone of
  the initializer with its shard index; the other copies of that shard
  (in other shard groups) copy its value, so that data-parallel copies of
  a shard start equal even from unseeded random initializers."""
  origins = ctx.state.provenance
  for variable in split_variables:
    assign = _initializer(variable)
    value_ops = graph_editor.topological_order(
        graph_editor.ancestors([assign.inputs[1].op]))
    groups = [op for op in ctx.graph.get_operations()
              if assign in op.control_inputs]
    group_size = sharded[variable.name].group_size
    _set_shard_indices(value_ops, _shard_of(ctx, 0, group_size), origins)
    first_write = {_shard_of(ctx, 0, group_size): (variable, assign)}
    for local in range(1, len(ctx.replicas)):
      replica_variable = copies.op(local, variable)
      shard = _shard_of(ctx, local, group_size)
      if shard in first_write:
        source, source_write = first_write[shard]
        with tf.device(replica_variable.device), tf.control_dependencies(
            [source_write]):
          write = assign_value(replica_variable, read_value(source),
                               name=None)
      else:
        clones = graph_editor.clone_ops(
            ctx.graph, value_ops + [assign],
            "%s_INIT_%d/%s/" % (epl_names.SPLIT, ctx.replicas[local],
                                variable.name),
            lambda _, device=replica_variable.device: device,
            tensor_map={variable.outputs[0].name:
                        replica_variable.outputs[0]},
            provenance=origins, replica=ctx.replicas[local])
        _set_shard_indices(clones.values(), shard, origins)
        write = clones[assign.name]
        first_write[shard] = (replica_variable, write)
      for group in groups:
        graph_editor.add_control_inputs(group, [write])


def _reduce_split_gradients(ctx, copies, points, sharded):
  """Split weights: each shard's gradient counts the loss of every member
  of its group (the collectives' gradients sum over the group), so it is
  divided by the group size k (with a mean reduction) and reduced over
  the same shard of the other groups; never over its own group."""
  reduction = ctx.plan.decisions.reduction.value
  for grad, variable in points:
    if isinstance(grad, tf.IndexedSlices):
      raise ValueError(
          "Split variable %r got a sparse gradient; EPL reduces only dense "
          "gradients of split weights." % variable.name)
    group_size = sharded[variable.name].group_size
    groups = ctx.plan.num_replicas // group_size
    # Every shard, local or not, in order: the collective keys then follow
    # the same sequence on every worker.
    for shard in range(group_size):
      replicas = [shard + g * group_size for g in range(groups)]
      locals_ = [l for l, r in enumerate(ctx.replicas) if r in replicas]
      grads = [copies.tensor(local, grad) for local in locals_]
      if groups > 1:
        communicator = CollectiveCommunicator(
            [ctx.plan.device(r, 0) for r in replicas],
            [replicas.index(ctx.replicas[l]) for l in locals_], ctx.keys,
            ctx.config.cluster.collective_timeout_seconds,
            ctx.cluster.device_type)
        reduced = communicator.all_reduce(grads, reduction.value)
      else:
        reduced = grads
      for local, old, new in zip(locals_, grads, reduced):
        with tf.device(old.device):
          if reduction is Reduction.MEAN:
            new = new / tf.cast(group_size, new.dtype)
        graph_editor.replace_input_in(
            graph_editor.consumers_of(old, copies.replica_op_names(local)),
            old, new)


def _check_sharded_logits_use(ctx):
  """Raises for a forward op that reads a split dense's sharded logits but
  was not built by a lowering: it would compute on one shard's classes."""
  for name, info in split_lowering.sharded_logits_in(ctx.graph).items():
    logits = ctx.graph.get_tensor_by_name(name)
    for consumer in logits.consumers():
      if consumer.name in info.lowered_consumers or (
          ctx.state.phase_of(consumer) is not Phase.FORWARD):
        continue
      raise ValueError(
          "Op %r (%s) reads the sharded logits %r of a split dense layer; "
          "EPL has no sharded version of it. Inside epl.split, logits may "
          "only go to tf.compat.v1.losses.sparse_softmax_cross_entropy, "
          "tf.nn.sparse_softmax_cross_entropy_with_logits, tf.argmax and "
          "tf.math.top_k." % (consumer.name, consumer.type, name))


def update_checkpoints(ctx, copies, split_variables):
  """Makes the Savers built so far save and restore the split variables
  `split_variables` (as `lower_split` hands them on) as full tensors
  (`full_tensor_checkpoints`; ops already rewritten are left as they
  are). Runs again before a Session.run for ops built since."""
  sharded = split_variables
  if not sharded:
    return
  with ctx.building(epl_names.SPLIT):
    full_tensor_checkpoints(ctx, copies, sharded, lambda local, group_size: (
        _shard_of(ctx, local, group_size)))


def lower_split(ctx, subgraph, gradient_points, copies):
  """Makes each replica's copy of every split part its shard.

  In every local replica (and micro-batch): the shard index consts take
  the replica's shard index; the collectives built for split parts read
  their shard group's group key and an instance key of their own (both
  found by their provenance role); the split variables (those built under
  `epl.split`, and their optimizer slots) are initialised per shard, saved
  and restored as full tensors (`full_tensor_checkpoints`), and leave the
  variables that replica 0 copies into the others (the subgraph's
  `variables`); their gradients leave the gradient points (so
  data-parallel aggregation skips them) and are reduced here as
  `_reduce_split_gradients` says. Raises for an op that reads sharded
  logits without a lowering. Hands on the sharded variables
  (`split_variables`, for the Savers built later). Nothing changes
  without a split TaskGraph.
  """
  result = {"subgraph": subgraph, "gradient_points": gradient_points,
            "split_variables": {}}
  if not ctx.plan.has_split:
    return result
  _check_sharded_logits_use(ctx)
  origins = ctx.state.provenance
  with ctx.building(epl_names.SPLIT):
    for local in range(len(ctx.replicas)):
      for op in copies.clones[local].values():
        if _is_shard_index(op, origins):
          taskgraph = ctx.plan.taskgraphs[ctx.taskgraph_index(op)]
          _set_int_const(op, _shard_of(ctx, local, taskgraph.device_count))
    count = _rekey_collectives(ctx, subgraph, copies)
    sharded = _sharded_variables(ctx, subgraph)
    split_variables = [v for v in subgraph.variables if v.name in sharded]
    names = set(sharded)
    result["subgraph"] = subgraph.without_variables(names)
    # A traced step's caller writes its split variables' shards before
    # every run (epl.runtime.traced_shards): no initializer.
    written = ctx.state.split.written_by_caller
    _initialize_shards(ctx, copies, [v for v in split_variables
                                     if v.name not in written], sharded)
    split_points = []
    for points in gradient_points:
      split_points.extend((g, v) for g, v in points if v.name in names)
    result["gradient_points"] = [
        [(g, v) for g, v in points if v.name not in names]
        for points in gradient_points]
    _reduce_split_gradients(ctx, copies, split_points, sharded)
    result["split_variables"] = sharded
    update_checkpoints(ctx, copies, sharded)
  logger.info("EPL split: %d sharded variable(s), %d collective(s) per "
              "replica and micro-batch re-keyed, shard groups %s",
              len(split_variables), count,
              [ctx.plan.split_groups(t) for t, plan in
               enumerate(ctx.plan.taskgraphs) if plan.kind == "split"])
  return result
