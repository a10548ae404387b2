"""Capture of a TF2 train step: what a `tf.function` records while it is
traced under EPL.

With eager execution on, the step a TF2 script trains with is a
`tf.function`; TensorFlow traces it once into a `FuncGraph`, which EPL
rewrites (`epl.runtime.traced_function`). While the graph is traced,
`epl.hooks` reports here the gradients `GradientTape.gradient` makes (they
are what the replicas reduce) and the strategy scopes the step's own code
opens. The records live beside the graph, weakly, so a dropped trace frees
them.
"""
import weakref

import tensorflow as tf


class TracedStep:
  """What tracing one `tf.function` graph recorded."""

  def __init__(self):
    # (gradient tensor, variable) in the order GradientTape made them.
    self.gradients = []
    # Gradients the replicas cannot reduce yet: (kind, variable name).
    self.unsupported_gradients = []
    # Strategy scopes (epl.replicate / epl.split) open while the step's
    # ops were built.
    self.strategies = []
    # Names of the ones the backward pass of each loss starts from.
    self.loss_seeds = set()
    # Names of the losses the gradients are taken of (their seeds may be
    # constants, which do not read them).
    self.losses = set()


_steps = weakref.WeakKeyDictionary()


def _step_for(graph):
  step = _steps.get(graph)
  if step is None:
    step = _steps[graph] = TracedStep()
  return step


def _outermost(graph):
  while getattr(getattr(graph, "outer_graph", None), "building_function",
                False):
    graph = graph.outer_graph
  return graph


def record_gradients(graph, sources, grads):
  """Records the gradients of the variables among `sources`; gradients
  taken in a function inside the step (a nested tf.function, a loop's body,
  jit_compile) are recorded as ones the replicas cannot reduce."""
  outermost = _outermost(graph)
  if outermost is not graph:
    _step_for(outermost).unsupported_gradients.extend(
        ("gradient taken inside a nested function (a tf.function called by "
         "the step, a loop body or jit_compile)", getattr(source, "name", "?"))
        for source, grad in zip(sources, grads) if grad is not None)
    return
  step = _step_for(graph)
  for source, grad in zip(sources, grads):
    if grad is None or not isinstance(source, tf.Variable):
      continue
    if isinstance(grad, tf.Tensor):
      step.gradients.append((grad, source))
    else:
      step.unsupported_gradients.append((type(grad).__name__, source.name))


def seed_gradients(graph, target):
  """The gradients `GradientTape.gradient` starts from for `target` (ones,
  as TensorFlow makes them when given none), recorded as the losses'
  seeds of the step `graph` traces."""
  seeds = tf.nest.map_structure(tf.ones_like, target)
  step = _step_for(_outermost(graph))
  step.loss_seeds.update(seed.op.name for seed in tf.nest.flatten(seeds))
  step.losses.update(loss.name for loss in tf.nest.flatten(target))
  return seeds


def record_strategy(graph, strategy):
  """Records that an op of the step was built inside `strategy`'s scope."""
  step = _step_for(graph)
  if not any(seen is strategy for seen in step.strategies):
    step.strategies.append(strategy)


def step_of(graph):
  """The TracedStep of a traced graph, or None when it made no gradient
  (not a training step)."""
  step = _steps.get(graph)
  if step is None or not (step.gradients or step.unsupported_gradients):
    return None
  return step
