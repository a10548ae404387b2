"""Rewrite-time checks that the captured TaskGraphs make a runnable pipeline.

The pipeline runs TaskGraph t of every micro-batch on stage t's device, in
stage order, once per micro-batch. Two ways of building a model break that,
and both are reported here, naming the ops, before any graph is changed:

- an op of the training step built outside every stage scope while no
  default strategy is set (it would run once, on no stage, for replica 0's
  first micro-batch only);
- a stage that consumes a tensor computed by a later stage (the pipeline
  would have to run backwards);
- a TF1 while-loop whose body spans two stages (a loop runs as one frame,
  so it cannot hand its iterations from one stage to the next).
"""
from epl.ir import control_flow
from epl.ir import graph_editor
from epl.ir.op_types import VARIABLE_READ_TYPES, VARIABLE_TYPES
from epl.ir.phase import Phase
from epl.parallel.passes.training_subgraph import written_variables


def _is_variable_or_read(op):
  if op.type in VARIABLE_TYPES:
    return True
  return op.type in VARIABLE_READ_TYPES and bool(op.inputs) and (
      op.inputs[0].op.type in VARIABLE_TYPES)


def _outside_message(state, op, stage_input):
  """What to do with `op`, built outside every scope, which reads
  `stage_input` of a scope."""
  taskgraph = state.taskgraph_of(stage_input)
  if taskgraph is not None and taskgraph.strategy.kind == "split":
    return (
        "Op %r (%s) computes on %r, an output of split scope %r, but was "
        "built outside every scope, and no default strategy is set; each "
        "replica holds one shard group's part of it. Build %r inside the "
        "`with epl.split(...)` block that computes %r (a split head's "
        "metrics, such as its accuracy, belong to its scope), or call "
        "epl.set_default_strategy(...) before building it." % (
            op.name, op.type, stage_input.name, taskgraph.name, op.name,
            stage_input.name))
  return (
      "Op %r (%s) computes on %r but was built outside every stage scope, "
      "and no default strategy is set. Build it inside a stage scope "
      "(with epl.replicate(device_count=1, name=...)) or call "
      "epl.set_default_strategy(...) before building it. Only the input "
      "pipeline (datasets, iterators, get_next) may be built outside the "
      "stages; it goes to the first stage that reads it." %
      (op.name, op.type, stage_input.name))


def _outside_every_stage(state, step, subgraph):
  """Raises for a compute op or trained variable built outside every scope."""
  cloned = subgraph.cloned_names
  for op in step.shared:
    if state.phase_of(op) is not Phase.OTHER:
      continue
    stage_inputs = [i for i in graph_editor.input_ops(op) if i.name in cloned]
    if stage_inputs:
      raise ValueError(_outside_message(state, op, stage_inputs[0]))
    if op.type in VARIABLE_TYPES and op.name not in step.global_steps and (
        any(op in written_variables(u) for u in step.updates)):
      raise ValueError(
          "Variable %r is trained but was created outside every stage scope, "
          "and no default strategy is set. Create it inside the stage that "
          "uses it, or call epl.set_default_strategy(...)." % op.name)


def _stage_order(state, subgraph):
  """Raises for a forward op that reads a later stage's forward output."""
  cloned = subgraph.cloned_names
  for op in subgraph.cloned:
    if state.phase_of(op) is not Phase.FORWARD:
      continue
    stage = state.taskgraph_of(op)
    for tensor in op.inputs:
      producer = tensor.op
      if producer.name not in cloned or _is_variable_or_read(producer) or (
          state.phase_of(producer) is not Phase.FORWARD):
        continue
      producer_stage = state.taskgraph_of(producer)
      if "split" in (stage.strategy.kind, producer_stage.strategy.kind):
        continue  # a split part shares its devices: no stage order
      if producer_stage.index > stage.index:
        raise ValueError(
            "Stage %r (TaskGraph %d) consumes %r, computed by the later stage "
            "%r (TaskGraph %d), in op %r. Pipeline stages run in the order "
            "their scopes were first entered; build each stage only from "
            "tensors of itself and of earlier stages." %
            (stage.name, stage.index, tensor.name, producer_stage.name,
             producer_stage.index, op.name))


def _loops_in_one_stage(state, subgraph):
  """Raises for a TF1 while-loop whose forward ops are in two stages."""
  stage_of_loop = {}
  for op in subgraph.cloned:
    if (state.phase_of(op) is not Phase.FORWARD or
        not control_flow.in_loop(op)):
      continue
    loop = control_flow.loop_name(op)
    stage = state.taskgraph_of(op)
    first_op, first_stage = stage_of_loop.setdefault(loop, (op, stage))
    if stage.index != first_stage.index:
      raise ValueError(
          "The TF1 while-loop %r spans two pipeline stages: its op %r is in "
          "stage %r (TaskGraph %d) and %r in stage %r (TaskGraph %d). A "
          "loop runs as one frame on one stage: build the whole "
          "tf.while_loop (or dynamic_rnn) inside one stage scope." %
          (loop, first_op.name, first_stage.name, first_stage.index,
           op.name, stage.name, stage.index))


def check_stages(ctx, captured_step, subgraph):
  """Checks that the stages make a pipeline; changes nothing.

  Raises ValueError for an op of the training step built outside every
  stage scope with no default strategy (the input pipeline excepted), for
  a trained variable created there, for a stage that reads a tensor of
  a later stage (variables excepted: any stage may read any variable),
  and for a TF1 while-loop built across two stages.
  """
  state = ctx.state
  _outside_every_stage(state, captured_step, subgraph)
  if len(state.taskgraphs) > 1:
    # First: a loop across stages also reads a later stage (its back edge).
    _loops_in_one_stage(state, subgraph)
    _stage_order(state, subgraph)
