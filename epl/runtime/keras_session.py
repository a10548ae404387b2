"""Keras' session in graph mode, opened again when EPL rewrites a graph it
already ran.

Keras 2 in graph mode runs its session before `Model.fit` builds the
training step: to initialise the model's variables, in `set_weights`,
`get_weights`, `reset_metrics`. TensorFlow ignores later edits to ops a
session already ran, and keeps the devices it gave them; the rewrite,
which runs at the first `Session.run` with a training step, re-wires the
user's forward ops (to their part of the batch) and places each stage on
its devices. Such a session would run the graph as it was.

So when Keras' session, having run the graph before, is about to run it
while EPL rewrites it, the values of the graph's initialised variables are
read first (the graph is still the one the session knows), then a new
session replaces it as Keras' session, where each value is written
through its variable's initialiser, fed (what `Variable.load` runs): EPL
copies such writes into every replica. Runs of the old session go to the
new one. State outside variables (an iterator's position) is not carried.
`epl.runtime.stale_sessions` tracks which sessions ran a graph before its
rewrite; a session the user opened is not replaced but raises (it says
why).
"""
import logging
import weakref

import tensorflow as tf

from epl.capture import capture
from epl.ir import names
from epl.ir.graph_state import state_of
from epl.runtime import stale_sessions
from epl.tf_compat import keras

logger = logging.getLogger("epl")

# Old session -> the session opened for it after the rewrite.
_renewed = weakref.WeakKeyDictionary()


def values_before_rewrite(session, run):
  """Called before each Session.run under EPL, before the rewrite: for
  Keras' session, when it already ran a graph that EPL may rewrite now
  (gradients recorded, not rewritten yet), the graph's initialised
  variables and their values, read with `run` (Session.run without EPL);
  None otherwise."""
  state = state_of(session.graph)
  if (session in _renewed or not keras.is_keras_session(session) or
      state is None or state.rewrite_result is not None or
      not state.gradient_records or
      not stale_sessions.ran_before_rewrite(session)):
    return None
  graph = session.graph
  variables = graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
  with capture.suspended(), graph.as_default(), tf.name_scope(
      names.KERAS_SESSION_RENEWAL):
    initialised = run(
        [tf.compat.v1.is_variable_initialized(v) for v in variables])
  variables = [v for v, done in zip(variables, initialised) if done]
  return variables, run(variables)


def session_after_rewrite(session, saved):
  """The session a Session.run of `session` runs in once EPL rewrote its
  graph: `session`, or the one opened for it (now, with `saved`, what
  `values_before_rewrite` read, when the rewrite has just happened)."""
  if session in _renewed:
    return _renewed[session]
  state = state_of(session.graph)
  if saved is None or state is None or state.rewrite_result is None:
    return session
  variables, values = saved
  renewed = tf.compat.v1.Session(graph=session.graph)
  _renewed[session] = renewed
  session.close()
  keras.set_session(renewed)
  for variable, value in zip(variables, values):
    renewed.run(variable.initializer,
                {variable.initializer.inputs[1]: value})
  logger.info("EPL: Keras' session ran the graph before EPL rewrote it: a "
              "new session runs the rewritten graph, with the values of "
              "%d variable(s) in every replica", len(variables))
  return renewed
