"""ZeRO v3's gathers: each use of a partitioned weight in the step reads
an all-gather of its shards over the worker's replicas, started
`zero.prefetch_layers` uses ahead (prefetch) and read by that use alone
(freed right after it).

A *use* is an op of replica 0's step that reads a partitioned weight (a
MatMul in forward, its input gradient's MatMul in backward, a
ResourceGather's rows); every local replica has its copy, and the N
copies of one use share one all-gather over the devices of the worker's
replicas, where the shards live: member r gives its shard, every member
gets the whole weight, and its copy of the use reads it. The gather is
the plan's communicator's (`decisions.Communication`): a
CollectiveGatherV2 per member with TensorFlow collectives; with local
sums (every replica a CPU device of this process) one concatenation that
every member reads, so a worker holds one copy of the weight, not N.

Order and lifetime. The uses of one micro-batch of one TaskGraph (its
forward, then its backward, which gathers again rather than keep the
forward's weight alive) form a *chain*: its forward uses, then its
backward ones, each in the step's topological order (a collective's
members also run their collectives in the order built).
With a window of w = zero.prefetch_layers, use k+w's shard reads wait
for use k's other inputs: its gather starts when use k can start
computing, so at most w + 1 gathered weights of a chain exist at a time
on a device, the one in use and the w prefetched. The first use of a
chain gathers just in time (its own other inputs), the next w - 1 when
the first can start. Each gathered weight is read by that use alone (its
copy in each replica), so TensorFlow frees it when that use is done.
A gather joins every replica's shard, so it waits for every replica to
reach use k: a wider window lets a replica that lags (its thread
descheduled on a shared host) fall further behind before the others
wait for it, at w weights' memory (on docs/zero.md's MLP of 8 wide
layers, windows of 2 and 3 measured no faster than 1, the default).
Chains are independent (groups of their own): a pipeline's schedule
orders micro-batches as it likes.

Uses inside a TF1 while-loop (a collective cannot run once per
iteration under one key) concatenate fresh reads of the shards on the
use's device instead (`concatenated`), as reads outside the step do
(logged).

Across workers each worker gathers over its own replicas (the k-th
replica of every worker holds the same shard); every worker allocates
the group keys of every worker's groups, in worker order, so the keys
agree. With Horovod (which runs between processes) the replicas of one
process still gather with TensorFlow's collectives: shards never leave
their worker.
"""
import dataclasses
import logging

import tensorflow as tf

from epl.communicators import backend
from epl.ir import control_flow
from epl.ir import graph_editor
from epl.ir.phase import Phase
from epl.parallel.passes.split_checkpoint import joined_shards
from epl.parallel.passes.variable_sync import read_value

logger = logging.getLogger("epl")

# The collective groups of the gathers, one per (TaskGraph, micro-batch).
_GROUP = "zero_v3_gather"


@dataclasses.dataclass
class Use:
  """`consumer` (an op of replica 0's step) reads partitioned weight
  `name` through `read` (a weight read; for a ResourceGather, the
  variable's handle: `rows`, the consumer takes rows of the weight)."""
  name: str
  consumer: tf.Operation
  read: tf.Tensor
  rows: bool = False


def chains(ctx, copies, uses):
  """{(TaskGraph, micro-batch): [Use]}: forward uses, then backward ones
  (recomputed forward ops count as backward), each in the step's
  topological order; keys sorted (every worker builds them in the same
  order). Forward first: the pipeline schedule makes a micro-batch's
  backward wait for all of its forward, which a topological order alone
  need not respect (a head's backward may come before another head's
  forward)."""
  step = [ctx.graph.get_operation_by_name(name)
          for name in copies.replica_op_names(0)]
  position = {op.name: index for index, op in
              enumerate(graph_editor.topological_order(step))}

  def order(use):
    phase = ctx.state.phase_of(use.consumer)
    return ({Phase.FORWARD: 0, Phase.BACKWARD: 1}.get(phase, 2),
            position[use.consumer.name], use.name)
  by_chain = {}
  for use in sorted(uses, key=order):
    variable = ctx.graph.get_operation_by_name(use.name)
    micro_batch = ctx.state.micro_batch_of(use.consumer)
    key = (ctx.taskgraph_index(variable), micro_batch or 0)
    by_chain.setdefault(key, []).append(use)
  return dict(sorted(by_chain.items()))


def _communicator(ctx, taskgraph, micro_batch):
  """A communicator of the plan's kind over TaskGraph `taskgraph` of this
  worker's replicas, in a group of its own for micro-batch `micro_batch`
  (with Horovod, which joins processes, TensorFlow's collectives)."""
  group = (_GROUP, taskgraph, micro_batch)
  by_worker = {}
  for replica in range(ctx.plan.num_replicas):
    by_worker.setdefault(ctx.plan.device_workers[replica][0], []).append(
        ctx.plan.device(replica, taskgraph))
  for _, devices in sorted(by_worker.items()):
    ctx.keys.group_key(devices, group)
  return backend.new_worker_communicator(
      ctx, [ctx.device(local, taskgraph)
            for local in range(len(ctx.replicas))], group)


def started(consumer, weight):
  """The producers of `consumer`'s inputs other than `weight` (and
  constants): once they are done, `consumer` can run."""
  return list(dict.fromkeys(
      t.op for t in consumer.inputs
      if t is not weight and t.op.type != "Const" and
      not control_flow.in_loop(t.op)))


def concatenated(ctx, copies, variable, info, device, waits_for=()):
  """The full value of partitioned `variable` on `device`, without a
  collective: every local shard read (each on its own device, after
  `waits_for`), concatenated. For reads outside the step and in loops."""
  with tf.control_dependencies(waits_for):
    shards = [read_value(copies.op(local, variable))
              for local in range(len(ctx.replicas))]
  with tf.device(device):
    return joined_shards(shards, info)


def _full(gathered, info, shape):
  """The gathered shards without the padding rows (none to cut: the
  gathered tensor itself), with the weight's static shape."""
  if info.columns * info.group_size != info.full_size:
    gathered = tf.slice(gathered, [0] * shape.rank,
                        [info.full_size] + [-1] * (shape.rank - 1))
  gathered.set_shape(shape)
  return gathered


def _read_by(ctx, copies, local, use, full):
  """Local replica `local`'s copy of `use` reads `full` (a ResourceGather
  takes its rows from it)."""
  consumer = copies.op(local, use.consumer)
  if use.rows:
    with tf.device(consumer.device):
      rows = tf.gather(full, consumer.inputs[1])
    graph_editor.replace_input_in(list(consumer.outputs[0].consumers()),
                                  consumer.outputs[0], rows)
  else:
    graph_editor.replace_input_in([consumer], copies.tensor(local, use.read),
                                  full)


def _gather(ctx, copies, weights, communicator, use, ahead):
  """The all-gather of `use` over the local replicas, which each copy of
  the use reads; its shard reads wait for the start of `ahead` (a (Use,
  {local: the weight it reads}) earlier in the chain) or, None, of `use`
  itself. Returns {local: the gathered weight}."""
  variable = ctx.graph.get_operation_by_name(use.name)
  info, shape = weights.shards[use.name], weights.full_shapes[use.name]
  reads = []
  for local in range(len(ctx.replicas)):
    if ahead is None:
      waits = started(copies.op(local, use.consumer),
                      copies.tensor(local, use.read))
    else:
      waits = started(copies.op(local, ahead[0].consumer), ahead[1][local])
    shard = copies.op(local, variable)
    # On the shard's device: a PlaceholderWithDefault without a device
    # would run on the host and carry every shard there and back.
    with tf.control_dependencies(waits), tf.device(shard.device):
      # The shard's static shape is still the full variable's.
      reads.append(graph_editor.with_unknown_sizes(read_value(shard)))
  fulls, cut = {}, {}
  for local, gathered in enumerate(communicator.all_gather(reads)):
    if gathered.name not in cut:
      with tf.device(gathered.device):
        cut[gathered.name] = _full(gathered, info, shape)
    fulls[local] = cut[gathered.name]
    _read_by(ctx, copies, local, use, fulls[local])
  return fulls


def _concatenate(ctx, copies, weights, use):
  """`use` in a TF1 while-loop: each copy reads the shards concatenated on
  its device, every iteration."""
  variable = ctx.graph.get_operation_by_name(use.name)
  for local in range(len(ctx.replicas)):
    consumer = copies.op(local, use.consumer)
    _read_by(ctx, copies, local, use, concatenated(
        ctx, copies, variable, weights.shards[use.name], consumer.device))


def gather_uses(ctx, copies, weights, uses):
  """Every local copy of each Use in `uses` reads its weight all-gathered
  from the shards in `weights` (ShardedWeights), zero.prefetch_layers
  uses ahead of need in its chain (see the module's note)."""
  window = ctx.config.zero.prefetch_layers
  in_loops = 0
  found = chains(ctx, copies, uses)
  for (taskgraph, micro_batch), chain in found.items():
    communicator, gathered = None, []
    for use in chain:
      if control_flow.in_loop(use.consumer):
        _concatenate(ctx, copies, weights, use)
        in_loops += 1
        continue
      communicator = communicator or _communicator(ctx, taskgraph,
                                                   micro_batch)
      ahead = gathered[max(len(gathered) - window, 0)] if gathered else None
      gathered.append((use, _gather(ctx, copies, weights, communicator, use,
                                    ahead)))
  logger.info(
      "ZeRO v3: %d use(s) of partitioned weights all-gathered over %d "
      "replicas, %d use(s) ahead, in %d chain(s) (TaskGraph, "
      "micro-batch)%s",
      len(uses) - in_loops, len(ctx.replicas), window, len(found),
      "; %d in while-loops concatenate the shards each iteration" %
      in_loops if in_loops else "")
