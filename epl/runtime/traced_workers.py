"""A traced TF2 step in a multi-worker job (`TF_CONFIG`): data parallel
across workers, between-graph, as a TF1 graph.

Every worker traces the same step and EPL's engine rewrites its copy into
this worker's replicas only (devices `/job:worker/replica:0/task:<k>/...`,
which the eager context serves: `epl.runtime.server`); the gradient
all-reduces and the merged outputs are collectives over every replica of
every worker, with keys from the order the rewrite builds them in, so
every worker must run the same script. At the first call worker 0's
values of the step's variables (weights, optimizer state) are broadcast
to the other workers, as a TF1 graph's init group does
(`variable_sync`): workers start equal even when each initialised its
model with other random values.

What is not built for a traced step across workers raises before the
step runs (`refuse`).
"""
import tensorflow as tf

from epl.capture import capture
from epl.parallel.passes import across_workers
from epl.parallel.passes import variable_sync

_FROM_WORKER_ZERO = "EPL_TRACED_FROM_WORKER_0"


def refuse(plan, config, name, whole_batch_readers=()):
  """The reason a traced step of plan `plan` (on a multi-worker cluster)
  is not run, naming the fix; None when it runs. `whole_batch_readers`:
  the step's ops outside its divided part that read a batch argument
  whole (`traced_whole_batch`)."""
  spanning = [r for r, workers in enumerate(plan.device_workers)
              if len(set(workers)) > 1]
  if spanning:
    return (
        "tf.function %s: model replica %d puts its %d pipeline stages on "
        "workers %s; a traced step runs each worker's own replicas only, "
        "so stages across workers are not built for it. Give every worker "
        "at least %d devices (cluster.num_cpu_devices or GPUs), or build "
        "the step TF1 style (docs/multi_worker.md, pipelines across "
        "workers)." % (name, spanning[0], plan.num_stages,
                       sorted(set(plan.device_workers[spanning[0]])),
                       plan.num_stages))
  if plan.has_split:
    return (
        "tf.function %s: epl.split in a traced step of a multi-worker job "
        "is not built yet (its shard groups and their collectives are "
        "tested on one worker only). Run the split step on one worker, or "
        "build it TF1 style, where split spans workers (docs/split.md)."
        % name)
  if whole_batch_readers:
    # They would read this worker's rows beside the divided part's values
    # merged over every worker's rows.
    return (
        "tf.function %s: %d op(s) outside the part EPL divides over "
        "replicas (%s), such as the updates of Keras metrics that read "
        "the targets in Model.fit or a train_step, read this worker's "
        "batch whole, beside values merged over the replicas of every "
        "worker; EPL does not gather a "
        "batch across workers for them yet. Across workers, compile "
        "without such metrics (the loss is reported for the global "
        "batch), return per-row values from the step and compute metrics "
        "from them, or train on one worker (docs/tf2.md, multi-worker "
        "jobs)." % (name, len(whole_batch_readers),
                    ", ".join(whole_batch_readers[:3])))
  if config.zero.level == "v3":
    return (
        "tf.function %s: zero.level 'v3' in a traced step of a multi-worker "
        "job is not built yet (the step's own shards of a partitioned "
        "variable are not written from worker 0's values at the first "
        "call). Use zero.level 'v1' or 'v2' there, or build the step TF1 "
        "style, where v3 spans workers (docs/zero.md)." % name)
  return None


def broadcast_into_user_variables(ctx, names):
  """Builds, in the rewritten graph of context `ctx`, the broadcast of
  worker 0's values of the variable ops `names` (the user's variables) to
  every other worker's, which writes them there. Returns (ops to run,
  {name: the value every worker then holds}); ([], {}) when one worker
  holds every replica."""
  if not across_workers.spans_workers(ctx):
    return [], {}
  graph = ctx.graph
  ops, values = [], {}
  communicators = {}
  with graph.as_default(), capture.suspended(), tf.name_scope(
      _FROM_WORKER_ZERO):
    for name in names:
      variable = graph.get_operation_by_name(name)
      taskgraph = ctx.taskgraph_index(variable) or 0
      if taskgraph not in communicators:
        communicators[taskgraph] = across_workers.leader_communicator(
            ctx, taskgraph)
      value = variable_sync.read_value(variable)
      received = across_workers.broadcast_from_worker_zero(
          communicators[taskgraph], value)
      # Worker 0 writes back what it sent: a tf.function runs a broadcast
      # only for a reader of its output (TensorFlow's automatic control
      # dependencies leave collectives out of the ops that must run).
      ops.append(variable_sync.assign_value(variable, received, None))
      values[name] = received
  return ops, values
