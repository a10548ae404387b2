"""EPL's boundary to TensorFlow's and Keras' internals.

Everything EPL uses that is not TensorFlow's public API comes from a module
of this package, and only from here (tests/test_layers.py checks it):

- `graph_edit`: editing ops in place (re-wiring inputs, control edges,
  attributes, devices; building an op as given; the v1 control-flow
  contexts of ops, copied for copies of them).
- `importer`: adding many nodes at once through the C API.
- `ops`: private op modules (V2 collectives, `gen_*` wrappers,
  `tensor_util`, `control_flow_ops`, resource variables).
- `stats`: the per-op statistics registry (FLOPs).
- `targets`: the TensorFlow entry points `epl.hooks` wraps.
- `keras`: the Keras layer classes it wraps, found per Keras version.
- `collective_order`: V2 collectives left unchained in a `tf.function`.
- `estimator`: tf.estimator's entry points, when it is installed.
- `training`: TF1 optimizer internals.
- `horovod`: Horovod, imported on first use.
- `thread_pools`: the intra-op pools of CPU devices, one per process or
  one per device.

This package imports only TensorFlow, Keras and the optional packages
above, never the rest of EPL. `VERSIONS` gives, for each of its functions
and hook targets, the TensorFlow versions it is known to work with; every
module that imports TensorFlow's internals imports `version_check` first,
which checks them (`check`), so an unsupported TensorFlow fails at once
with one error naming the function and its range. tests/test_tf_compat.py has a contract test for every entry: a
TensorFlow upgrade that changes one fails there first.
"""
from typing import NamedTuple, Tuple

# Which Keras a compat function needs.
ANY_KERAS = "any"
# Keras 2: bundled with TF 2.15; tf-keras on 2.16 and later under
# TF_USE_LEGACY_KERAS=1 (not Keras 3: no keras.src.engine, other add_weight
# arguments, no tf.compat.v1.layers).
KERAS_2 = "keras2"
KERAS_3 = "keras3"


class Range(NamedTuple):
  """TensorFlow versions (major, minor), both ends included, that a compat
  function is known to work with. `optional` says why the feature may be
  absent; outside its range such a function is absent, and the feature
  that needs it raises when used, instead of the import."""
  first: Tuple[int, int]
  last: Tuple[int, int]
  keras: str = ANY_KERAS
  optional: str = ""

  def holds(self, version):
    return self.first <= version <= self.last

  def __str__(self):
    return "%d.%d-%d.%d" % (self.first + self.last)


_TESTED = Range((2, 15), (2, 21))
_KERAS_2 = Range((2, 15), (2, 21), keras=KERAS_2)

# Each function and hook target of this package, as "<module>.<name>", and
# the TensorFlow versions it works with (tests/test_tf_compat.py checks
# each).
VERSIONS = {
    # graph_edit: editing ops in place; v1 control-flow contexts.
    **{"graph_edit." + name: _TESTED for name in (
        "update_input", "set_attr", "add_control_inputs",
        "remove_all_control_inputs", "set_device", "control_outputs",
        "creation_index", "is_ref_dtype", "declared_input_types",
        "create_op", "default_original_op", "graph_function",
        "in_graph_context", "control_flow_context",
        "containing_while_context", "containing_while_context_of",
        "control_flow_context_def", "context_def_kind", "context_from_def",
        "building_in_context", "nested_contexts",
        "set_control_flow_context", "building_v1_control_flow",
        "join_while_context", "enter_while_context",
        "while_control_pivot")},
    # importer: adding nodes through the C API.
    "importer.names_in_use": _TESTED,
    "importer.import_nodes": _TESTED,
    # ops: private op modules and framework types.
    **{"ops." + name: _TESTED for name in (
        "EagerTensor", "collective_ops", "control_flow_ops",
        "gen_resource_variable_ops", "gen_state_ops",
        "gradient_registered", "onednn_graph_rewrites",
        "resource_variable_ops", "tensor_util", "variable_spec")},
    # stats: the per-op statistics registry.
    **{"stats." + name: _TESTED for name in (
        "OpStats", "register_statistics", "stats_for_node_def",
        "tensor_shape_from_node_def_name")},
    # targets: the entry points epl.hooks wraps.
    **{"targets." + name: _TESTED for name in (
        "CREATE_OP", "GRAPH_FINALIZE", "GRADIENTS", "DEFAULT_GRAD_YS",
        "TAPE_GRADIENT", "APPLY_GRADIENTS", "SESSION_INIT", "SESSION_RUN",
        "DATASET_READERS", "LIST_FILES", "DATASET_ITERATORS", "SAVER_SAVE",
        "SAVER_RESTORE", "EVENT_FILE_WRITER", "WRITE_GRAPH", "ARG_MAX",
        "EQUAL", "TOP_K", "FUNCTION_CALL")},
    # tape: the forward op a GradientTape differentiates in a trace.
    **{"tape." + name: _TESTED for name in (
        "GRADIENT_LOOKUP", "is_gradient_registry", "forward_op",
        "original_op_scope")},
    # thread_pools: a pool of its own for each CPU device.
    "thread_pools.ask_pool_per_device": _TESTED,
    # training: TF1 optimizer internals.
    "training.base_finish": _TESTED,
    # collective_order: the ordering tokens of V2 collectives and the
    # chain a tf.function makes of them.
    "collective_order.unchain": _TESTED,
    "collective_order.drop_chain": _TESTED,
    # Keras 2's build of a layer's weights (a split Dense in a TF2 step).
    "keras.build_layer": _KERAS_2,
    # keras: the Keras 2 layers epl.split hooks (and TensorFlow's frozen
    # copy of them); under Keras 3 its training entry points, refused.
    "keras.targets": _KERAS_2,
    # Keras 2's Model.fit step count and steps_per_execution, which
    # epl.runtime.keras_fit keeps as Keras' own train function does.
    "keras.count_train_step": _KERAS_2,
    "keras.steps_per_execution": _KERAS_2,
    # Keras 2's backend functions and session in graph mode, which
    # epl.runtime.keras_graph_fit and keras_session run through Session.run.
    **{"keras." + name: _KERAS_2 for name in (
        "set_graph_function_callable", "graph_function_step",
        "is_keras_session", "set_session")},
    # Keras 2's metrics of each output's loss in graph mode, which
    # epl.runtime.keras_graph_fit gives the loss merged over replicas.
    "keras.output_loss_results": _KERAS_2,
    # The tf.Variable a gradient's source is, Keras 3 variables included.
    "keras.tf_variable_of": _TESTED,
    "keras.keras3_training_targets": Range(
        (2, 16), (2, 21), keras=KERAS_3,
        optional="Keras 3 is TensorFlow's Keras from 2.16"),
    # estimator, horovod: optional packages.
    "estimator.targets": Range(
        (2, 15), (2, 15),
        optional="tensorflow-estimator is gone from TensorFlow 2.16"),
    "horovod.horovod_api": Range(
        (2, 15), (2, 15),
        optional="Horovod 0.28.1 does not build against TensorFlow 2.21"),
}


def parse_version(version):
  """(major, minor) of a TensorFlow version string ("2.16.0rc1")."""
  major, minor = version.split(".")[:2]
  return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def check(version):
  """Raises ImportError when TensorFlow `version` (a string) is outside the
  range of a function EPL needs (every entry but the optional ones); the
  error names the first such function and its range."""
  found = parse_version(version)
  outside = [(name, supported) for name, supported in VERSIONS.items()
             if not supported.optional and not supported.holds(found)]
  if outside:
    name, supported = outside[0]
    others = (" (and %d more)" % (len(outside) - 1)
              if len(outside) > 1 else "")
    raise ImportError(
        "EPL does not support TensorFlow %s: epl.tf_compat.%s%s relies on "
        "TensorFlow internals known to work with TensorFlow %s "
        "(epl.tf_compat.VERSIONS). Install a TensorFlow in that range "
        "(pip install 'epl[cpu]' for 2.15, 'epl[cpu-latest]' for 2.21); "
        "to port EPL, run tests/test_tf_compat.py on it and widen the "
        "range of each function whose contract holds." % (
            version, name, others, supported))
