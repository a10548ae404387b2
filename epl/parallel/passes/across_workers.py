"""What the rewrite adds when replicas live on several workers.

Between-graph data parallelism: every worker builds the same graph and runs
its own local replicas; gradient all-reduces already span every replica.
Two more things cross workers, both with collectives over one member per
worker, its *leader* (its first local replica):

- variable sync: after an init or restore group writes the user's variables,
  worker 0's values (global replica 0) are broadcast to every other
  worker's leader; local copies to the other replicas follow
  (`variable_sync.VariableSync`);
- merged fetches: each worker merges its local replicas, then the leaders
  combine the local results (`merge_outputs`).

Collective keys come from the order in which the rewrite builds these ops,
so every worker must build the same graph in the same order.
"""
import tensorflow as tf

from epl.communicators.backend import new_communicator


def peers(plan, local):
  """The `local`-th replica of each worker that holds replicas, by worker."""
  by_worker = {}
  for replica in range(plan.num_replicas):
    by_worker.setdefault(plan.device_workers[replica][0], []).append(replica)
  return [replicas[local] for _, replicas in sorted(by_worker.items())]


def leaders(plan):
  """The first replica of each worker that holds replicas, by worker."""
  return peers(plan, 0)


def spans_workers(ctx):
  return bool(ctx.replicas) and len(leaders(ctx.plan)) > 1


def peer_communicator(ctx, local, taskgraph_index):
  """A communicator over TaskGraph `taskgraph_index` of the `local`-th
  replica of every worker; this worker builds ops for its own.

  Each call gives a new communicator, so that its collectives are ordered
  among themselves only.
  """
  replicas = peers(ctx.plan, local)
  devices = [ctx.plan.device(r, taskgraph_index) for r in replicas]
  return new_communicator(ctx, devices, [replicas.index(ctx.replicas[local])])


def leader_communicator(ctx, taskgraph_index):
  """A communicator over TaskGraph `taskgraph_index` of every leader."""
  return peer_communicator(ctx, 0, taskgraph_index)


def broadcast_from_worker_zero(communicator, value):
  """On worker 0 sends `value`, elsewhere returns worker 0's value."""
  return communicator.broadcast([value], 0)[0]


def merge(ctx, key, local_merged, taskgraph_index):
  """Combines this worker's merge of its local replicas with the others'.

  `key` is the epl.GraphKeys collection: mean (weighted by each worker's
  replica count), sum, or concatenation in worker order (which is replica
  order). Returns `local_merged` unchanged when one worker holds all
  replicas.
  """
  if not spans_workers(ctx):
    return local_merged
  communicator = leader_communicator(ctx, taskgraph_index)
  with tf.device(ctx.device(0, taskgraph_index)):
    if key == "global_concat_objects":
      return communicator.all_gather([local_merged])[0]
    if key == "global_sum_objects":
      return communicator.all_reduce([local_merged], "sum")[0]
    weighted = local_merged * tf.cast(len(ctx.replicas), local_merged.dtype)
    total = communicator.all_reduce([weighted], "sum")[0]
    return total / tf.cast(ctx.plan.num_replicas, total.dtype)
