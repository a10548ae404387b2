"""ZeRO (zero.level): each data-parallel replica updates its share only.

Without ZeRO every replica holds the optimizer's slots for every variable
and applies every update. With ZeRO the trained variables of each TaskGraph
(each pipeline stage) are dealt out to the replicas of this worker,
balanced by size (`balance.balanced_partition`); the replica that owns a
variable alone holds its slots and runs its update, and then copies the new
value into the other replicas' copies of the variable.

How the rewrite does it. The ops `apply_gradients` built for one variable
(its update op, its slots, their reads; found from the graph: the apply ops
whose data flow touches that variable alone) are the variable's *update*.
Updates are taken out of the cloned part before the replicas are cloned,
so no other replica gets a copy. The user's own update ops (replica 0's)
become the owner's: they are placed on the owner's device and read the
owner's variable, gradient and shared optimizer values (learning rate,
Adam's beta powers). So the slots keep their names and exist once:
checkpoints hold each slot once under its own name, and restore both ways.

- v0: gradients are all-reduced as without ZeRO; only the owner reads the
  result (every replica still runs its all-reduce, joined to the step).
- v1: gradients are reduced to their owner only: the owner sums every
  replica's gradient (TensorFlow sends them to it); no replica holds the
  reduced gradient of a variable it does not own. (No reduce-scatter kernel
  exists on CPU; within a worker this per-owner reduce is what it would do.)
  With several micro-batches each replica first sums its own micro-batches
  (a full set of gradients per replica), then sends the sum.
- v2: as v1, and with several micro-batches each micro-batch's gradient
  goes to its owner as soon as backward makes it: the owner alone sums
  them, so a replica holds the running sum of its own share only. The
  per-replica sums `clone_micro_batches` built for those gradients are
  taken out of the cloned part (and out of the pipeline schedule).
- v3: as v2, and the weights themselves partitioned: each replica stores
  one shard of every variable large enough (and its slots), gathered
  just before use; see `epl.parallel.passes.zero_weights`. Variables it leaves whole
  are dealt to owners as v2 does.

Variables built under `epl.split` (and their slots) are left alone: each
replica already holds one shard of them and applies that shard's update,
so they have nothing to deal; the replicated part of the model keeps its
ZeRO (`_split_variables`).

Replicas partitioned are those of one worker: a multi-worker job keeps a
full set of slots on every worker, and with v1, v2 and v3 the owners of the
same share on each worker (the k-th replica of each) all-reduce their local
sums. Optimizer values shared by every variable (Adam's beta powers,
scalars) stay one per replica.
"""
import collections
import dataclasses
import logging
from typing import Dict, List, Optional

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from epl.ir import graph_editor
from epl.ir import names as epl_names
from epl.ir import pass_through
from epl.ir import variables as ir_variables
from epl.ir.op_types import VARIABLE_TYPES
from epl.parallel.ops import split_lowering
from epl.ir.phase import Phase
from epl.parallel.passes import across_workers
from epl.parallel.passes import zero_weights
from epl.parallel.passes.context import Accumulation
from epl.parallel.passes.variable_sync import assign_value, read_value
from epl.parallel.plan.balance import balanced_partition, variable_size
from epl.parallel.plan.decisions import Reduction, ZeroLevel

logger = logging.getLogger("epl")


@dataclasses.dataclass
class Partition:
  """Which local replica owns each trained variable, and its update ops.

  `owner[v]` is the local replica index owning variable op `v`;
  `updates[v]` the ops of its update (topologically ordered); `points`
  the (gradient, variable) pairs of the partitioned variables;
  `accumulations[v]` (v2) the micro-batch sum of v's gradient that its
  owner builds instead of every replica; `reduced[v]` the tensors of v's
  gradient reduced on its owner (v1 and v2; filled by `place_updates`);
  `weights` (v3) the variables partitioned into shards, whose updates
  every replica keeps for its shard (not in `updates` nor `points`).
  """
  level: ZeroLevel
  owner: Dict[str, int]
  updates: Dict[str, List[tf.Operation]]
  variables: Dict[str, tf.Operation]
  points: list
  accumulations: Dict[str, Accumulation] = dataclasses.field(
      default_factory=dict)
  reduced: Dict[str, list] = dataclasses.field(default_factory=dict)
  weights: Optional[zero_weights.ShardedWeights] = None

  @property
  def reduces_to_owners(self):
    """Whether gradients are reduced on their owner only (v1, v2, v3)."""
    return self.level.reduces_to_owners

  @property
  def reduced_points(self):
    """The (gradient, variable) pairs reduced on one replica: the owned
    variables' (`points`) and, v3, the partitioned weights' (each shard on
    its replica)."""
    return self.points + (self.weights.points if self.weights else [])

  @property
  def reduced_gradients(self):
    """{variable name: its reduced gradient tensors} of `reduced_points`."""
    return dict(self.reduced, **(self.weights.reduced if self.weights
                                 else {}))


def _tensors(grad):
  if isinstance(grad, tf.IndexedSlices):
    return [grad.values, grad.indices]
  return [grad]


def _check_level(ctx):
  """The ZeRO level to build (the plan's), or None; raises for what cannot
  work."""
  decided = ctx.plan.decisions.zero.value
  if decided is ZeroLevel.NONE:
    return None
  level = decided.value
  reduces = decided.reduces_to_owners
  if reduces and ctx.config.communication.clip_after_allreduce:
    raise ValueError(
        "zero.level %r keeps each reduced gradient on its owner only, so "
        "communication.clip_after_allreduce (clipping that sees every reduced "
        "gradient) cannot run. Use zero.level 'v0', or clip per replica."
        % level)
  per_worker = collections.Counter(
      workers[0] for workers in ctx.plan.device_workers)
  if reduces and len(set(per_worker.values())) > 1:
    raise NotImplementedError(
        "zero.level %r across workers needs as many replicas on every "
        "worker (the owners of a share reduce together); replicas per worker "
        "are %s. Use zero.level 'v0'." % (level, dict(per_worker)))
  if len(ctx.replicas) < 2:
    logger.warning("zero.level %r has no effect: this worker holds one "
                   "model replica, nothing to partition over.", level)
    return None
  return decided


def _owner_accumulations(ctx, subgraph, copies, points, updates):
  """v2 and v3: {variable name: Accumulation} of the partitioned gradients
  summed over micro-batches that only their update reads, so that their
  owner (v3: each shard's replica) can sum the micro-batches instead of
  every replica.

  Warns for a gradient whose micro-batches cannot be summed on its owner:
  one post-processed per replica after the sum (clipping), or a sum
  something besides the update reads; those are summed by every replica
  and then reduced, as v1 does.
  """
  if ctx.plan.num_micro_batch == 1:
    return {}
  taken, kept = {}, []
  for grad, var in points:
    accumulation = copies.accumulations.get(_tensors(grad)[0].name)
    update_names = {op.name for op in updates[var.name]}
    if accumulation is not None:
      built = {op.name for op in accumulation.ops}
      readers = {c.name for t in _tensors(grad) for c in t.consumers()}
      inner = {c.name for op in accumulation.ops for t in op.outputs
               for c in t.consumers()}
      if not (readers - update_names) and not (inner - built -
                                                update_names):
        taken[var.name] = accumulation
        continue
    kept.append(var.name)
  if kept:
    logger.warning(
        "zero.level %s: the micro-batch sum of the gradient of %s is read "
        "by more than its update (post-processing per replica, such as "
        "clipping); every replica sums those micro-batches in full before "
        "reducing to the owner, as v1 does.",
        ctx.plan.decisions.zero.value.value,
        ", ".join(sorted(kept)))
  return taken


def _split_variables(ctx, variables, updates):
  """The trained variables built under `epl.split` (recorded by the split
  lowerings), which ZeRO leaves alone: each replica already holds one shard
  of them and applies its shard's update, with its own slots (those of the
  update), so nothing is left to deal to owners. Logs them."""
  recorded = split_lowering.sharded_variables_in(ctx.graph)
  split = sorted(name for name in variables if name in recorded)
  if split:
    slots = sorted(op.name for name in split for op in updates[name]
                   if op.type in VARIABLE_TYPES)
    logger.info(
        "ZeRO %s leaves the split variables %s%s to their shard groups: "
        "each replica already holds and updates its shard only; the "
        "replicated variables are partitioned.",
        ctx.plan.decisions.zero.value.value,
        ", ".join(split),
        " and their optimizer slots %s" % ", ".join(slots) if slots else "")
  return set(split)


def _trained_variables(gradient_points):
  """{name: variable op} of the variables of the gradient points, and the
  points as one list."""
  variables, points = {}, []
  for record_points in gradient_points:
    for grad, var in record_points:
      variables[var.name] = var
      points.append((grad, var))
  return variables, points


def _updates(ctx, subgraph, gradients, gradient_points, variables, level):
  """{variable name: the APPLY ops of the subgraph that update it alone};
  empty (with a warning) for a variable updated in an op shared with
  others."""
  apply_ops = [op for op in subgraph.cloned
               if ctx.state.phase_of(op) is Phase.APPLY]
  updates = ir_variables.updates_of(
      apply_ops, [pair for pairs in list(gradient_points) +
                  list(gradients.applied) for pair in pairs], variables)
  mixed = sorted(name for name, ops in updates.items() if not ops)
  if mixed:
    logger.warning(
        "zero.level %s: the update of %s is built together with other "
        "variables' (one op for several); its optimizer state stays on every "
        "replica.", level.value, ", ".join(mixed))
  return updates


def _check_updates_read_gradients(level, points, updates, sharded=False):
  """Raises for an owned variable whose update reads its gradient only
  through an op that other gradients feed too (besides Identity and
  IdentityN, which `_reduce_to_owners` follows): that op would run on its
  replica's own gradients, while the gradient is reduced to its owner
  alone, so the owner would apply an unreduced gradient. v3's `sharded`
  weights (whose reduce-scatter follows no op) must be read directly."""
  for grad, var in points:
    names = {op.name for op in updates[var.name]}
    for tensor in _tensors(grad):
      read = [tensor] if sharded else pass_through.views(tensor)
      if any(c.name in names for view in read for c in view.consumers()):
        continue
      after = {op.name for op in graph_editor.descendants([tensor.op])}
      through = sorted({t.op.name for op in updates[var.name]
                        for t in op.inputs
                        if t.op.name in after and t.op.name not in names})
      raise ValueError(
          "zero.level %r: the update of %r reads its gradient %r through "
          "%s; %r reduces each gradient to its variable's owner only, so "
          "that op would see one replica's gradient, not the reduced one. "
          "%s, or use zero.level 'v0'."
          % (level.value, var.name, tensor.name,
             ", ".join(repr(n) for n in through) or "no op of its update",
             level.value,
             "Raise zero.min_partition_size above its size (its shards "
             "are updated from the gradient itself only)" if sharded else
             "Process each gradient on its own before apply_gradients "
             "(tf.clip_by_norm, tf.identity and tf.identity_n work)"))


def _deal_owners(ctx, variables, owned, level):
  """{variable name: owner local replica} of the `owned` variables, dealt
  per TaskGraph so that each replica holds about as many elements."""
  owner = {}
  by_taskgraph = {}
  for name in owned:
    by_taskgraph.setdefault(ctx.taskgraph_index(variables[name]), []).append(
        name)
  for taskgraph, names in sorted(by_taskgraph.items()):
    parts = balanced_partition([variable_size(variables[n]) for n in names],
                               len(ctx.replicas))
    for local, part in enumerate(parts):
      for index in part:
        owner[names[index]] = local
    logger.info(
        "ZeRO %s: TaskGraph %d's %d variables dealt to %d replicas, "
        "elements per replica %s", level.value, taskgraph, len(names),
        len(ctx.replicas),
        [sum(variable_size(variables[names[i]]) for i in p) for p in parts])
  return owner


def partition_updates(ctx, subgraph, gradients, gradient_points, copies):
  """Decides the owner of every trained variable; takes the updates out of
  the cloned part (before the replicas are cloned).

  Hands on the Partition (`zero_partition`, None when this worker holds
  one replica) and the subgraph without each update's ops and slots (v2,
  v3: nor the micro-batch sums that the owners build instead); v3 first
  takes the variables the plan partitions into shards
  (`zero_weights.choose_sharded`), whose updates every replica keeps.
  Changes nothing in the graph.
  """
  level = _check_level(ctx)
  if level is None:
    return {"subgraph": subgraph, "zero_partition": None}
  variables, points = _trained_variables(gradient_points)
  updates = _updates(ctx, subgraph, gradients, gradient_points, variables,
                     level)
  split = _split_variables(ctx, variables, updates)
  points = [(g, v) for g, v in points if v.name not in split]
  weights = (zero_weights.choose_sharded(
      ctx, points, {n: ops for n, ops in updates.items() if ops})
              if level.partitions_weights else None)
  sharded = set(weights.updates) if weights else set()
  owned = [name for name in variables
           if updates[name] and name not in sharded and name not in split]
  owner = _deal_owners(ctx, variables, owned, level)
  owned_points = [(g, v) for g, v in points if v.name in owner]
  if level.reduces_to_owners:
    _check_updates_read_gradients(level, owned_points, updates)
  if weights:
    _check_updates_read_gradients(level, weights.points, weights.updates,
                                  sharded=True)
  accumulations = (_owner_accumulations(
      ctx, subgraph, copies,
      owned_points + (weights.points if weights else []), updates)
                   if level.partitions_gradients else {})
  removed = {op.name for name in owned for op in updates[name]}
  removed.update(op.name for accumulation in accumulations.values()
                 for op in accumulation.ops)
  return {"subgraph": subgraph.without(removed),
          "zero_partition": Partition(
              level=level, owner=owner,
              updates={n: updates[n] for n in owned},
              variables=variables, points=owned_points,
              accumulations=accumulations, weights=weights)}


def _remap_colocation(op, local, subgraph, copies):
  if "_class" not in op.node_def.attr:
    return
  groups = []
  for entry in op.get_attr("_class"):
    target = entry.decode()[len("loc:@"):]
    if target in subgraph.cloned_names:
      target = copies.clones[local][target].name
    groups.append(("loc:@" + target).encode())
  graph_editor.set_attr(op, "_class", attr_value_pb2.AttrValue(
      list=attr_value_pb2.AttrValue.ListValue(s=groups)))


def _move_to_owner(ctx, subgraph, copies, ops, local):
  """The user's update ops become local replica `local`'s: its device, its
  inputs; `copies` follows."""
  for op in ops:
    for index, tensor in enumerate(op.inputs):
      if tensor.op.name in subgraph.cloned_names:
        graph_editor.update_input(op, index, copies.tensor(local, tensor))
    _remap_colocation(op, local, subgraph, copies)
    graph_editor.set_device(op, ctx.device(local, ctx.taskgraph_index(op)))
    del copies.clones[0][op.name]
    copies.clones[local][op.name] = op


def _join_after(step, partition, name, ops):
  """What fetching the step runs after variable `name`'s update (the joins
  and shared writes downstream of it) waits for `ops` too.

  Only those: a join before the update (grouped apply's NoOp of an earlier
  group, which the later groups' updates wait for) waiting for ops made
  after the update would close a cycle.
  """
  after = {op.name for op in graph_editor.descendants(partition.updates[name])}
  ends = [op for op in step.joins + step.shared_writes if op.name in after]
  if not ends:
    raise ValueError(
        "zero.level %s: no op of the training step waits for the update of "
        "%s, so nothing would run its copies into the other replicas. Fetch "
        "the op apply_gradients returned (or a tf.group of it)." % (
            partition.level.value, name))
  for end in ends:
    graph_editor.add_control_inputs(end, ops)


def _keep_all_reduces(ctx, step, copies, partition):
  """v0: every replica's all-reduce of every gradient runs in the step.

  A replica reads the reduced gradients of the variables it owns only; an
  Identity per replica and gradient (registered with that replica's ops,
  so gradient aggregation makes it read the reduced value) joined to the
  joins after the variable's update makes the others run too: a collective
  needs every member.
  """
  for grad, var in partition.points:
    sinks = []
    for local in range(len(ctx.replicas)):
      for tensor in _tensors(grad):
        replica_tensor = copies.tensor(local, tensor)
        with tf.device(replica_tensor.device):
          sink = tf.identity(replica_tensor, name=epl_names.in_replica(
              epl_names.ZERO, ctx.replicas[local], var.name, "keep"))
        copies.clones[local][sink.op.name] = sink.op
        sinks.append(sink.op)
    _join_after(step, partition, var.name, sinks)


def _reduce_to_owners(ctx, copies, gradient_points, partition):
  """v1 and v2: each gradient summed (or averaged) on its owner's device
  from every replica's; the owner's update reads that. v2: from every
  replica's gradient of each micro-batch, in micro-batch order (the owner
  adds each as it arrives), where `partition.accumulations` has its sum.
  Across workers, the owners of one share (the k-th replica of each worker)
  then all-reduce their local sums (IndexedSlices: all-gather). Records the
  reduced tensors in `partition.reduced`; returns the gradient points
  without those gradients, so they are not all-reduced."""
  mean = ctx.plan.decisions.reduction.value is Reduction.MEAN
  across = across_workers.spans_workers(ctx)
  for grad, var in partition.points:
    owner = partition.owner[var.name]
    taskgraph = ctx.taskgraph_index(var)
    update_names = {op.name for op in partition.updates[var.name]}
    accumulation = partition.accumulations.get(var.name)
    parts = accumulation.parts if accumulation else [grad]
    replicas = [owner] + [l for l in range(len(ctx.replicas)) if l != owner]
    pieces = [[copies.tensor(l, t) for t in _tensors(part)]
              for part in parts for l in replicas]
    peers = across_workers.peer_communicator(ctx, owner, taskgraph) \
        if across else None
    with tf.device(ctx.device(owner, taskgraph)), tf.name_scope(
        "%s/reduce/%s" % (epl_names.ZERO, var.name)):
      if isinstance(grad, tf.IndexedSlices):
        reduced = [tf.concat([p[i] for p in pieces], 0) for i in (0, 1)]
        if across:
          reduced = [peers.all_gather([t])[0] for t in reduced]
      else:
        total = pieces[0][0]
        for piece in pieces[1:]:
          total = total + piece[0]
        reduced = [peers.all_reduce([total], "sum")[0] if across else total]
      if mean:
        reduced[0] = reduced[0] / (ctx.plan.num_replicas * len(parts))
    for old, new in zip([copies.tensor(owner, t) for t in _tensors(grad)],
                        reduced):
      # The update may read it through an IdentityN of every gradient.
      for view in pass_through.views(old):
        graph_editor.replace_input_in(
            graph_editor.consumers_of(view, update_names), view, new)
    partition.reduced[var.name] = reduced
  taken = {id(grad) for grad, _ in partition.points}
  return [[(g, v) for g, v in points if id(g) not in taken]
          for points in gradient_points]


def _broadcast_updates(ctx, step, copies, partition):
  """After its update, the owner's new value is written into every other
  replica's copy of the variable; the joins after the update wait for the
  writes."""
  for name, ops in partition.updates.items():
    writes = []
    owner = partition.owner[name]
    variable = partition.variables[name]
    with tf.control_dependencies(ops), tf.name_scope(
        "%s/broadcast/%s" % (epl_names.ZERO, name)):
      value = read_value(copies.op(owner, variable))
    for local in range(len(ctx.replicas)):
      if local != owner:
        writes.append(assign_value(
            copies.op(local, variable), value, epl_names.in_replica(
                epl_names.ZERO, ctx.replicas[local], name, "from_owner")))
    _join_after(step, partition, name, writes)


def place_updates(ctx, zero_partition, captured_step, subgraph,
                  gradient_points, copies):
  """Makes each variable's update run on its owner only (after the replicas
  are cloned, before gradient aggregation).

  Moves the user's update ops to their owner replica (device, inputs,
  colocation), wires the gradients to the owners (v0: every replica's
  all-reduce kept in the step; v1 and v2: reduced on the owner instead of
  all-reduced, v2 micro-batch by micro-batch) and adds the copies of the new values into the other
  replicas, which the joins after each update wait for. Hands on the copy
  map (updates moved to their owners) and the gradient points (v1, v2:
  without the gradients reduced to their owners). Without a partition, does
  nothing.
  """
  partition = zero_partition
  result = {"gradient_points": gradient_points, "copies": copies}
  if partition is None:
    return result
  with ctx.building(""), \
      ctx.graph.colocate_with(None, ignore_existing=True):
    for name, ops in partition.updates.items():
      if partition.owner[name]:
        _move_to_owner(ctx, subgraph, copies, ops, partition.owner[name])
    if partition.reduces_to_owners:
      result["gradient_points"] = _reduce_to_owners(ctx, copies,
                                                    gradient_points, partition)
    else:
      _keep_all_reduces(ctx, captured_step, copies, partition)
    _broadcast_updates(ctx, captured_step, copies, partition)
  return result
