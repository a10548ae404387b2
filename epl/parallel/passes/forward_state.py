"""Forward state updates (batch-norm moving statistics) once per step.

A write to a variable made by the forward pass, such as the
`AssignMovingAvg` ops of `tf.compat.v1.layers.batch_normalization`, would
otherwise run once per micro-batch on every replica, each with its own
batch statistics, and the replicas' moving statistics would drift apart.
"""
import tensorflow as tf

from epl.ir import graph_editor
from epl.ir import names as epl_names
from epl.ir.phase import Phase
from epl.parallel.passes.training_subgraph import written_variables

# Collectives of forward state updates: a chain of their own.
_CHAIN = "forward_state"


def forward_writes(ctx, subgraph):
  """The user's writes of replicated variables in the forward pass."""
  replicated = {v.name for v in subgraph.variables}
  return [op for op in subgraph.cloned
          if ctx.state.phase_of(op) is Phase.FORWARD and
          ctx.state.micro_batch_of(op) in (None, 0) and
          any(v.name in replicated for v in written_variables(op))]


def average_forward_state_updates(ctx, captured_step, subgraph, copies):
  """Makes each forward write run once per step with the mean update.

  For a forward write (its value input: the moving average's decrement,
  or the value assigned), micro-batch 0's write of each replica now writes
  the mean of the value over the replica's micro-batches, all-reduced
  (mean) over every replica: the moving statistics move once per step by
  the mean of the replicas' and micro-batches' updates, identically on
  every replica. The other micro-batches' writes lose the control edges
  that ran them, and the writes no longer gate the backward pass (which
  would wait on every micro-batch's forward and stall a pipeline); they
  run with the train ops that followed them instead (the step's joins
  after them), outside every micro-batch's block of the pipeline
  schedule, and the user's write waits for its replicas' copies, so
  fetching `UPDATE_OPS` runs all of them. Nothing else changes.
  """
  writes = forward_writes(ctx, subgraph)
  if not writes:
    return
  replicas = range(len(ctx.replicas))
  join_names = {op.name for op in captured_step.joins}
  with ctx.building(epl_names.FORWARD_STATE):
    for write in writes:
      joins = [op for op in graph_editor.descendants([write])
               if op.name in join_names]
      taskgraph = ctx.taskgraph_index(write)
      micro_batch_writes = copies.micro_batch_ops(write)
      means = []
      for local in replicas:
        replica_copies = [copies.op(local, c) for c in micro_batch_writes]
        with tf.device(replica_copies[0].device):
          values = [c.inputs[1] for c in replica_copies]
          means.append(values[0] if len(values) == 1 else
                       tf.add_n(values) / float(len(values)))
      if ctx.plan.num_replicas > 1:
        means = ctx.communicator(taskgraph, _CHAIN).all_reduce(means, "mean")
      for local in replicas:
        replica_copies = [copies.op(local, c) for c in micro_batch_writes]
        graph_editor.update_input(replica_copies[0], 1, means[local])
        for copy in replica_copies:
          # Once per step: in no micro-batch's block of the schedule.
          ctx.state.set_micro_batch(copy, None)
          for waiting in list(graph_editor.control_outputs(copy)):
            if waiting.name not in join_names:
              graph_editor.remove_control_input(waiting, copy)
        for join in joins:
          graph_editor.add_control_inputs(join, [replica_copies[0]])
      graph_editor.add_control_inputs(
          write, [copies.op(local, write) for local in replicas if local])
