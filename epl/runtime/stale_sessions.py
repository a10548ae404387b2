"""Sessions that ran a graph before EPL rewrote it.

EPL rewrites the user's graph in place at the first `Session.run` that
finds a training step in it (`epl.parallel.engine`): it re-wires the
user's forward ops to their part of the batch and places every op on its
replica's or stage's devices. TensorFlow ignores edits to ops a session
already knows (it knows every op that existed at its last run, run or not:
"This mutation will have no effect"), so a session that ran the graph
before the training step was built would go on running the graph as it
was: replica 0 on the whole batch, stages on the devices TensorFlow chose.

Keras' session is opened again with its variables' values
(`epl.runtime.keras_session`): Keras runs it before `fit` builds the step,
whatever the user writes. A session the user opened is not replaced: the
values of its variables could be carried, but not what else it holds (an
iterator's position, a random op's sequence, a lookup table, a queue), and
the old object would lead a double life (its `make_callable`,
`list_devices`, `close`). Its first run once the graph is rewritten raises
instead, naming the fix; a session opened after the rewrite is fine.
"""
import weakref

from epl.ir.graph_state import state_of

# Sessions that ran their graph while EPL had not rewritten it yet.
_ran_before_rewrite = weakref.WeakSet()


class StaleSessionError(RuntimeError):
  """A session that ran its graph before EPL rewrote it runs it again."""


def ran_before_rewrite(session):
  """Whether `session` ran its graph while EPL had not rewritten it."""
  return session in _ran_before_rewrite


def check_run(session):
  """Called before each Session.run under EPL, after the rewrite had its
  chance: remembers a session that runs its graph unrewritten, and raises
  for one that did so and now runs the rewritten graph."""
  state = state_of(session.graph)
  if state is None or state.rewrite_result is None:
    _ran_before_rewrite.add(session)
    return
  if session in _ran_before_rewrite:
    raise StaleSessionError(
        "EPL: this session ran its graph before the graph's training step "
        "was built; "
        "EPL rewrote the graph (replicas, pipeline stages, devices) at the "
        "first Session.run with a training step, and TensorFlow ignores "
        "edits to ops a session has run, so this session would train the "
        "graph as it was: one device's model on the whole batch, without a "
        "word. Build the train op (optimizer.minimize / apply_gradients) "
        "before the first sess.run, or open a new session after building "
        "it (and initialise or restore the variables there).")
