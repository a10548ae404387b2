"""Capture: tag every op with its TaskGraph and phase as the user builds it,
and record the gradients of variables where TensorFlow makes them.

`epl.hooks` calls into this module from the few TensorFlow entry points it
wraps (op creation, `tf.gradients`, `GradientTape.gradient`,
`Optimizer.apply_gradients`); nothing else in EPL touches TensorFlow's
internals to capture. Gradients are recorded where they are made, as the
original EPL did, so any optimizer is seen: `tf.compat.v1.train` ones,
subclasses that override `apply_gradients` (Google BERT's AdamW), Keras
optimizers and hand-written updates. The rewrite finds the updates by what
they write.

The phase stack and the suspension counter are per thread, like
TensorFlow's own graph scopes.
"""
import contextlib
import threading

import tensorflow as tf

from epl.capture import traced_step
from epl.ir import variables
from epl.ir.graph_state import ApplyRecord, GradientRecord, state_of
from epl.ir.phase import Phase
from epl.tf_compat import graph_edit


class _ThreadState(threading.local):

  def __init__(self):
    super().__init__()
    # Phase contexts entered by the wrapped TensorFlow entry points.
    self.phases = []
    # Set while EPL itself builds ops (the rewrite), so that they are not
    # captured as user ops.
    self.suspended = 0
    # Provenance roles opened by `role_scope`.
    self.roles = []


_thread = _ThreadState()


@contextlib.contextmanager
def phase_scope(phase):
  """Ops created inside are tagged with `phase`."""
  _thread.phases.append(phase)
  try:
    yield
  finally:
    _thread.phases.pop()


def current_phase():
  return _thread.phases[-1] if _thread.phases else None


@contextlib.contextmanager
def role_scope(role):
  """Ops created inside (while the user builds the model) are recorded with
  `role` in the graph's provenance (epl.ir.provenance)."""
  _thread.roles.append(role)
  try:
    yield
  finally:
    _thread.roles.pop()


@contextlib.contextmanager
def suspended():
  """Ops created inside are not captured (EPL's own ops)."""
  _thread.suspended += 1
  try:
    yield
  finally:
    _thread.suspended -= 1


def _is_function_graph(graph):
  return getattr(graph, "building_function", False)


def on_op_created(env, op, strategy_after_cut):
  """Tags a newly created op with its TaskGraph and phase.

  Ops built by `tf.gradients` are BACKWARD and belong to the TaskGraph of
  the forward op they differentiate; ops built by `apply_gradients` are
  APPLY; ops built under a strategy (a scope or the default; with
  auto.auto_parallel, after the cut, the last stage) are FORWARD work of
  its TaskGraph; ops built before the first strategy scope are
  FORWARD work of the first TaskGraph; other ops are OTHER.
  `strategy_after_cut(state)` is the strategy of ops built with no scope
  once auto parallel has cut the graph, None before (`epl.parallel.plan.auto`,
  which plans above capture: `epl.hooks` passes it in). Inside a
  `role_scope`, the op's role is recorded too.
  """
  graph = op.graph
  if _thread.suspended:
    return
  if _is_function_graph(graph):
    if env.active_strategy is not None:
      traced_step.record_strategy(graph, env.active_strategy)
    if not tf.compat.v1.executing_eagerly_outside_functions():
      # A function inside a TF1 graph (a tf.data map, a v2 loop's body)
      # is not the step.
      return
    # A TF2 step traced with eager execution on (epl.capture.traced_step)
    # is tagged as a TF1 graph is, for the engine's rewrite of its copy
    # (epl.runtime.traced_engine).
  state = state_of(graph, create=True)
  if _thread.roles:
    state.provenance.record_role(op, _thread.roles[-1])
  phase = current_phase()
  if phase is Phase.BACKWARD:
    # tf.gradients builds each gradient under `_original_op(forward_op)`;
    # ops without one (gradient aggregation, GradientTape) are resolved
    # from their neighbours by the rewrite.
    forward_op = graph_edit.default_original_op(graph)
    taskgraph = state.taskgraph_of(forward_op) if forward_op else None
    state.tag(op, taskgraph, phase)
  elif phase is Phase.APPLY:
    state.tag(op, None, phase)
  else:
    strategy = env.current_strategy()
    if strategy is None and env.config.auto.auto_parallel:
      strategy = strategy_after_cut(state)
    if strategy is not None:
      state.tag(op, state.taskgraph_for(strategy), Phase.FORWARD)
    elif not state.taskgraphs:
      state.tag_before_first_strategy(op)
    else:
      state.tag(op, None, Phase.OTHER)


def densify_sparse_gradients(grads):
  """IndexedSlices gradients as dense Tensors (communication.sparse_as_dense)."""
  return [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
          for g in grads]


def record_gradients(sources, grads):
  """Records the gradients of the variables among `sources` (one
  `tf.gradients` or `GradientTape.gradient` call)."""
  pairs = []
  for source, grad in zip(sources, grads):
    if grad is None:
      continue
    variable = variables.op_of(source)
    if variable is not None and not _is_function_graph(variable.graph):
      pairs.append((grad, variable))
  if pairs:
    state_of(pairs[0][1].graph, create=True).gradient_records.append(
        GradientRecord(tuple(pairs)))


def record_loss_seeds(grad_ys, seeds):
  """Records the seeds `tf.gradients` made (`seeds`, one per output) for
  the outputs it was given no `grad_ys` for: the losses' gradients, which
  the loss scale multiplies."""
  made = [seed.op for given, seed in zip(grad_ys, seeds) if given is None]
  if not made or _thread.suspended or _is_function_graph(made[0].graph):
    return
  state = state_of(made[0].graph, create=True)
  state.loss_seeds.update(op.name for op in made)


def record_apply(grads_and_vars, train_op, global_step):
  """Records one `apply_gradients` call: which gradients it applied."""
  pairs = [(g, variables.op_of(v)) for g, v in grads_and_vars if g is not None]
  pairs = [(g, v) for g, v in pairs if v is not None]
  if not pairs:
    return
  state_of(pairs[0][1].graph, create=True).apply_records.append(
      ApplyRecord(grads_and_vars=tuple(pairs), train_op=train_op,
                  global_step=global_step))


def record_slots(optimizer, grads_and_vars):
  """Records the slots `optimizer` (a `tf.compat.v1.train.Optimizer`) holds
  for the variables it applied (`epl.ir.variables.slot_owner`); called for
  every `apply_gradients`, inner ones too, as an optimizer that wraps
  another holds no slots of its own."""
  for name in optimizer.get_slot_names():
    for _, variable in grads_and_vars:
      owner = variables.op_of(variable)
      slot = variables.op_of(optimizer.get_slot(variable, name))
      if owner is not None and slot is not None:
        state_of(owner.graph, create=True).slot_owners[slot.name] = owner
