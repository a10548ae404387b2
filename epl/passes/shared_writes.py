"""One consistent step: writes of shared variables (the `global_step`
increment) run once, after every replica has read the old value."""
from epl.ir import control_flow
from epl.ir import graph_editor
from epl.passes.training_subgraph import (variable_consumers,
                                          written_variables)


def order_shared_writes(ctx, captured_step, subgraph, copies):
  """Makes each write of a shared variable wait for the step that reads it.

  A shared write (the `global_step` increment, whether `apply_gradients`
  or the user's `tf.group(train_op, global_step.assign_add(1))` built it)
  gets control edges from every copy, in every local replica and
  micro-batch, of the reads of that variable and of the updates that run
  with it (those feeding the same joins): every replica computes its
  learning rate from the same `global_step`, and the increment runs after
  every replica's update. Reads and updates that come after the write, and
  those of other train ops, are left alone, so running one train op never
  runs another's step. Only control edges are added, and none that TF1
  control flow forbids (control_flow.conditional_op_names): none from an
  op in a while-loop or a cond branch (a skipped update of TF's loss-scale
  optimizer would skip the increment), none to a write in a loop.
  """
  if not captured_step.shared_writes:
    return
  step_names = set()
  for local in range(len(ctx.replicas)):
    step_names.update(copies.replica_op_names(local))
  for write in captured_step.shared_writes:
    after = graph_editor.descendants([write])
    after_names = {op.name for op in after}
    joins = [op for op in after if op.type == "NoOp"]
    with_write = {op.name for op in graph_editor.ancestors(joins)} if joins \
        else step_names
    readers = [reader for variable in written_variables(write)
               for reader in variable_consumers(variable)
               if not written_variables(reader)]
    waits = [op for op in readers
             if op.name in step_names and op.name in with_write and
             op.name not in after_names]
    for local in range(len(ctx.replicas)):
      waits.extend(
          op for op in (copies.op(local, u) for u in captured_step.updates
                        if u.name in subgraph.cloned_names)
          if op.name in with_write and op.name not in after_names)
    conditional = control_flow.conditional_op_names(waits + [write])
    if write.name in conditional and control_flow.in_loop(write):
      continue
    graph_editor.add_control_inputs(
        write, [op for op in waits if op.name not in conditional])
