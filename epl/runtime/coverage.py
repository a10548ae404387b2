"""No silent single-device training.

Under strategies, a `Session.run` that trains variables (writes a
trainable variable from values computed from other variables) through ops
that EPL did not rewrite is an error: training would run on one replica
with its batch, not the job's. This happens when EPL never saw the
gradients (computed inside a `tf.function`, a Keras 3 optimizer,
`Model.fit`), or when the train op was built after EPL rewrote the graph
at its first run. Initialisers (and `var.load`, which runs them) and restores,
which write values that come from no other variable, pass.
"""
import weakref

import tensorflow as tf

from epl.ir import graph_editor
from epl.ir import variables
from epl.ir.graph_state import state_of
from epl.ir.op_types import FUNCTION_CALL_TYPES, VARIABLE_TYPES
from epl.parallel.passes.training_subgraph import written_variables

# GraphState -> fetch sets (op names) found to train nothing EPL did not
# rewrite.
_CHECKED_FETCHES = weakref.WeakKeyDictionary()


def fetched_ops(fetch, graph, result):
  """Appends the ops of `fetch` (any Session.run fetch structure)."""
  if isinstance(fetch, (list, tuple)):
    for item in fetch:
      fetched_ops(item, graph, result)
  elif isinstance(fetch, dict):
    for item in fetch.values():
      fetched_ops(item, graph, result)
  elif isinstance(fetch, tf.Operation):
    result.append(fetch)
  elif isinstance(fetch, str):
    try:
      element = graph.as_graph_element(fetch)
    except (KeyError, ValueError, TypeError):
      return
    fetched_ops(element, graph, result)
  elif isinstance(fetch, tf.IndexedSlices):
    fetched_ops([fetch.values, fetch.indices], graph, result)
  elif hasattr(fetch, "op") and isinstance(fetch.op, tf.Operation):
    result.append(fetch.op)


def _covered_names(state):
  result = state.rewrite_result
  if result is None:
    return frozenset()
  if result.covered_names is None:
    names = set(result.subgraph.cloned_names)
    names.update(op.name for op in result.step.shared + result.step.joins)
    names.update(result.copies.clones[0])
    result.covered_names = frozenset(names)
  return result.covered_names


def _uncovered_ancestors(roots, covered):
  """`roots` and their ancestors, not walking past ops EPL rewrote (whose
  ancestors are all part of the rewritten step)."""
  return graph_editor.reachable(
      roots, lambda op: [] if op.name in covered else
      graph_editor.input_ops(op))


def _trains(op, written, trainable, covered):
  """Whether `op` writes `written` from values computed from variables:
  a function call (which reads what it is given), or an op whose inputs
  other than its targets come from a trainable variable or from the
  rewritten training step."""
  if op.type in FUNCTION_CALL_TYPES:
    return True
  targets = {v.name for v in written}
  roots = [t.op for t in op.inputs if t.op.name not in targets]
  roots += op.control_inputs
  return any(a.name in covered or (
      a.type in VARIABLE_TYPES and a.name in trainable and
      a.name not in targets) for a in _uncovered_ancestors(roots, covered))


# Variable names an error lists before it says how many more there are.
_LISTED_NAMES = 5


def _listed(names):
  """`names`, quoted, the first few only."""
  names = list(names)
  listed = ", ".join(repr(name) for name in names[:_LISTED_NAMES])
  if len(names) > _LISTED_NAMES:
    listed += " and %d more variables" % (len(names) - _LISTED_NAMES)
  return listed


def check_run(graph, fetches):
  """Raises if running `fetches` trains variables EPL did not parallelise.

  Checked once per distinct set of fetches, in graphs that use strategies.
  """
  state = state_of(graph)
  if state is None or not state.taskgraphs:
    return
  ops = []
  fetched_ops(fetches, graph, ops)
  key = frozenset(op.name for op in ops)
  checked = _CHECKED_FETCHES.setdefault(state, set())
  if key in checked:
    return
  covered = _covered_names(state)
  trainable = set()
  for variable in graph.get_collection(
      tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES):
    op = variables.op_of(variable)
    if op is not None:
      trainable.add(op.name)
  # Initialisers (also what var.load runs) write what the user chose.
  initializers = {getattr(v, "initializer", None) for v in graph.get_collection(
      tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)}
  for op in _uncovered_ancestors(ops, covered):
    # EPL's own ops (replica copies, variable sync, collectives) are known
    # by their provenance.
    if (op.name in covered or state.provenance.built_by_rewrite(op) or
        op in initializers):
      continue
    written = [v for v in written_variables(op) if v.name in trainable]
    if written and _trains(op, written, trainable, covered):
      raise RuntimeError(
          "EPL: this Session.run trains %s through op %r (%s), which EPL "
          "did not parallelise, so it would train on one replica's batch "
          "only. EPL sees gradients made by tf.gradients, "
          "Optimizer.compute_gradients/minimize and GradientTape.gradient "
          "in this graph before its first Session.run. Gradients computed "
          "inside a tf.function, Keras 3 optimizers and Model.fit are not "
          "seen; neither is a train op built after the first Session.run. "
          "Build the whole training step (tf.compat.v1.train or "
          "tf.keras.optimizers.legacy optimizers) before the first run." %
          (_listed(v.name for v in written), op.name, op.type))
  checked.add(key)
