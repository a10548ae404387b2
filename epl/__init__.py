"""EPL: Easy Parallel Library for TensorFlow 2.x graph mode.

Add a few annotations to a TF1-style (`tf.compat.v1`) training script and it
trains data parallel, pipelined, or both, over every device of every worker:

    import epl
    epl.init()
    epl.set_default_strategy(epl.replicate(device_count=1))
    ...  # the unchanged single-device model, optimizer and session
"""
import importlib

from epl.tf_compat import keras_selection

# Before TensorFlow first reads it (`epl.tf_compat.keras_selection`): a
# TF_USE_LEGACY_KERAS=1 without tf-keras installed would break tf.keras.
keras_selection.drop_unusable_request()

# The public names and the modules that define them. They load on first
# use (PEP 562), so that `import epl` alone, as in
# `python -m epl.tools.launcher` (epl-launch), does not import TensorFlow.
_EXPORTS = {
    "Cluster": "epl.cluster",
    "Graph": "epl.ir.graph",
    "Operation": "epl.ir.graph",
    "StrategyNestingError": "epl.env",
    "GraphKeys": "epl.collections",
    "add_to_collection": "epl.collections",
    "get_collection": "epl.collections",
    "Config": "epl.config",
    "Env": "epl.env",
    "init": "epl.api",
    "set_default_strategy": "epl.api",
    "shutdown": "epl.api",
    "WorkerFailureError": "epl.runtime.failures",
    "replicate": "epl.strategies",
    "split": "epl.strategies",
}
# Public submodules and the modules they are, loaded on first use the same
# way (the original EPL's names).
_SUBMODULES = {"env": "epl.env", "ir": "epl.ir",
               "timeline": "epl.tools.timeline"}


def __getattr__(name):
  if name in _SUBMODULES:
    return importlib.import_module(_SUBMODULES[name])
  module = _EXPORTS.get(name)
  if module is None:
    raise AttributeError("module 'epl' has no attribute %r" % name)
  value = getattr(importlib.import_module(module), name)
  globals()[name] = value
  return value


def __dir__():
  return sorted(list(globals()) + list(_EXPORTS) + list(_SUBMODULES))


__version__ = "0.1.0"

__all__ = [
    "Cluster", "Config", "Env", "Graph", "GraphKeys", "Operation",
    "StrategyNestingError", "WorkerFailureError", "add_to_collection",
    "get_collection", "init", "replicate", "set_default_strategy",
    "shutdown", "split", "timeline",
]
