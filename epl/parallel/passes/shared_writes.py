"""One consistent step: a variable is written after the step has read its
old value. Writes of shared variables (the `global_step` increment) run
once, after every replica has read them; the updates of reference
variables, whose reads are no snapshots, after their replica's reads."""
from epl.ir import control_flow
from epl.ir import graph_editor
from epl.parallel.passes.training_subgraph import value_readers, written_variables


def _run_with(write, step_names, cache):
  """(names of the ops that run with `write`, of the ops after it): the
  ancestors of the joins that wait for it (every op of the step when none
  does), and its descendants. `cache` keeps the ancestors per set of
  joins: the updates of one train op share them."""
  after = graph_editor.descendants([write])
  joins = frozenset(op for op in after if op.type == "NoOp")
  if not joins:
    return step_names, {op.name for op in after}
  if joins not in cache:
    cache[joins] = {op.name for op in graph_editor.ancestors(list(joins))}
  return cache[joins], {op.name for op in after}


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
  cache = {}
  for write in captured_step.shared_writes:
    with_write, after_names = _run_with(write, step_names, cache)
    readers = [reader for variable in written_variables(write)
               for reader in value_readers(variable)]
    waits = [op for op in readers
             if op.name in step_names and op.name in with_write and
             op.name not in after_names]
    for local in range(len(ctx.replicas)):
      waits.extend(
          op for op in (copies.op(local, u) for u in captured_step.updates
                        if u.name in subgraph.cloned_names)
          if op.name in with_write and op.name not in after_names)
    if control_flow.in_loop(write):
      continue
    conditional = control_flow.conditional_op_names(waits)
    graph_editor.add_control_inputs(
        write, [op for op in waits if op.name not in conditional])


def _wait_for_reads(update, step_names, cache):
  """Makes `update`, when it writes a reference variable outside every
  loop, wait for the reads of it among `step_names` that run with it and
  do not come after it (none in a TF1 while-loop or cond branch)."""
  variables = [v for v in written_variables(update)
               if graph_editor.is_ref_dtype(v.outputs[0].dtype)]
  if not variables or control_flow.in_loop(update):
    return
  with_write, after_names = _run_with(update, step_names, cache)
  readers = [op for variable in variables for op in value_readers(variable)
             if op.name in step_names and op.name in with_write and
             op.name not in after_names]
  conditional = control_flow.conditional_op_names(readers)
  graph_editor.add_control_inputs(
      update, [op for op in readers if op.name not in conditional])


def order_reference_updates(ctx, captured_step, subgraph, copies):
  """Makes each replica's update of a reference variable wait for that
  replica's reads of it.

  A VariableV2 (TF1 graphs, `disable_v2_behavior()`) is read through an
  Identity that passes its buffer on: the op that uses the value reads
  whatever the variable holds when it runs. Nothing orders the backward
  ops that read a weight (the gradient of a layer's input) before the
  update of that weight unless the optimizer gates them
  (`compute_gradients`' GATE_OP); with `tf.gradients` + `apply_gradients`
  the update may run first, and the all-reduce between a gradient and its
  update changes which does. Every local replica's copy of an update of a
  reference variable gets control edges from the copies, in its replica
  and every micro-batch, of the reads of that variable that run with it
  and do not come after it; an update that exists once for every replica
  (shared weights) waits for the reads of every replica. Resource
  variables, whose reads are snapshots, are left alone. Only control
  edges are added, none from a read in a TF1 while-loop or cond branch
  (control_flow.conditional_op_names; such a read is not ordered) nor to
  an update in a loop.
  """
  cache = {}
  shared_writes = {op.name for op in captured_step.shared_writes}
  every_replica = set()
  for local in range(len(ctx.replicas)):
    step_names = copies.replica_op_names(local)
    every_replica.update(step_names)
    for update in captured_step.updates:
      if update.name in subgraph.cloned_names:
        _wait_for_reads(copies.op(local, update), step_names, cache)
  for update in captured_step.updates:
    if (update.name not in subgraph.cloned_names and
        update.name not in shared_writes):
      _wait_for_reads(update, every_replica, {})
