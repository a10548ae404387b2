"""The strategy scopes a functional Keras model's layers were called in
while the model was built, re-entered when a traced TF2 step calls them.

A functional model (`tf.keras.Input`, then layers called on its tensors,
each inside `with epl.replicate(1, name="stage_0"):` ...) is built
eagerly, before any step is traced; when the step is traced,
`Functional.call` calls the layers again, long after the scopes closed,
so their ops would belong to no stage and the step would train data
parallel instead of the pipeline asked for. So each layer called
eagerly under a scope (on Keras tensors, being added to a functional
model, or on values, to build its weights) records that scope here, and
a layer called while a step is traced, with no scope open, is called
inside the scope it recorded: the step is then captured as if the
model's `call` opened the scopes itself.

One replicate scope around a whole model (`with epl.replicate(1):`,
data parallelism) is not re-entered: such a model trains data parallel
under the default strategy, as one built outside every scope does.
"""
import contextlib
import logging
import weakref

from epl.strategies.strategy import Replicate

logger = logging.getLogger("epl")

# layer -> (the Env it was recorded in, its strategy); weak, so that a
# model's layers are forgotten with the model.
_recorded = weakref.WeakKeyDictionary()
# The Envs whose re-entered scopes were logged.
_announced = weakref.WeakSet()


class LayerInTwoScopes(ValueError):
  """A layer called eagerly in two different strategy scopes: its
  weights can belong to one only."""


def record(env, layer):
  """Records the scope `layer` is called in eagerly (on Keras tensors, as
  a functional model is built, or on values), `env.active_strategy`;
  a call outside every scope records nothing. Raises `LayerInTwoScopes`
  for a layer called in two different scopes."""
  strategy = env.active_strategy
  if strategy is None:
    return
  known_env, known = _recorded.get(layer, (None, None))
  # Scopes of one name are one TaskGraph (a subclassed model's call
  # opens a new scope object of the same name at each call).
  if known_env is env and known is not None and known.name != strategy.name:
    raise LayerInTwoScopes(
        "Keras layer %r is called in %r and in %r; its weights can "
        "belong to one scope only. Make a separate layer object for each "
        "scope." % (
            layer.name, known, strategy))
  _recorded[layer] = (env, strategy)


def _strategies(env):
  """The strategies of distinct names recorded under `env`."""
  found = {}
  for layer_env, strategy in list(_recorded.values()):
    if layer_env is env:
      found[strategy.name] = strategy
  return list(found.values())


def scope_for_traced_call(env, layer):
  """The context to call `layer` in while a TF2 step is traced: the
  scope it was recorded in, unless a scope is open already (the open
  one holds the call, as it holds any op) or the model was built in one
  replicate scope alone."""
  known_env, strategy = _recorded.get(layer, (None, None))
  if known_env is not env or env.active_strategy is not None:
    return contextlib.nullcontext()
  strategies = _strategies(env)
  if len(strategies) == 1 and isinstance(strategy, Replicate):
    return contextlib.nullcontext()
  if env not in _announced:
    _announced.add(env)
    logger.info(
        "epl: the layers of functional Keras models are called in the "
        "scopes they were called in while the models were built (%s)",
        ", ".join(repr(s) for s in strategies))
  return strategy
