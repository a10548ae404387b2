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
- `estimator`: tf.estimator's entry points, when it is installed.
- `training`: TF1 optimizer internals.
- `horovod`: Horovod, imported on first use.

This package imports only TensorFlow, Keras and the optional packages
above, never the rest of EPL. tests/test_tf_compat.py has one contract test
per private call and hook target: a TensorFlow upgrade that changes one
fails there first.
"""
import collections

# TensorFlow and Keras versions each private call and hook target works
# with. "2.15" is TF 2.15.x with its bundled Keras 2; "2.16-2.21" is TF
# 2.16 to 2.21, with tf-keras under TF_USE_LEGACY_KERAS=1 ("tf-keras") or
# with the default Keras 3 ("keras3"). A target that a version lacks is
# not installed there; the feature that needs it raises and says so.
Support = collections.namedtuple("Support", ["tensorflow", "keras"])

_ALL_TF = "2.15-2.21"
_ANY_KERAS = "any (not used)"
_LEGACY_KERAS = ("Keras 2 bundled with TF 2.15; tf-keras 2.16-2.21 under "
                 "TF_USE_LEGACY_KERAS=1; not keras3 (no keras.src.engine, "
                 "other add_weight arguments, no tf.compat.v1.layers)")

VERSIONS = {
    # graph_edit
    "Operation._update_input": Support(_ALL_TF, _ANY_KERAS),
    "Operation._set_attr": Support(_ALL_TF, _ANY_KERAS),
    "Operation._add_control_inputs": Support(_ALL_TF, _ANY_KERAS),
    "Operation._remove_all_control_inputs": Support(_ALL_TF, _ANY_KERAS),
    "Operation._set_device": Support(_ALL_TF, _ANY_KERAS),
    "Operation._control_outputs": Support(_ALL_TF, _ANY_KERAS),
    "Operation._id": Support(_ALL_TF, _ANY_KERAS),
    "DType._is_ref_dtype": Support(_ALL_TF, _ANY_KERAS),
    "Operation._input_types": Support(_ALL_TF, _ANY_KERAS),
    "Graph._create_op_internal": Support(_ALL_TF, _ANY_KERAS),
    "Graph._default_original_op": Support(_ALL_TF, _ANY_KERAS),
    "Graph._get_function": Support(_ALL_TF, _ANY_KERAS),
    "ops._default_graph_stack.is_cleared": Support(_ALL_TF, _ANY_KERAS),
    "Operation._control_flow_context, _set_control_flow_context; "
    "Graph._get/_set_control_flow_context; ControlFlowContext."
    "_nested_contexts, to_control_flow_context_def; "
    "control_flow_ops.from_control_flow_context_def; "
    "control_flow_util.GetContainingWhileContext":
        Support(_ALL_TF, _ANY_KERAS),
    "control_flow_util.ENABLE_CONTROL_FLOW_V2; WhileContext._values, "
    "AddValue, GetControlPivot": Support(_ALL_TF, _ANY_KERAS),
    # importer
    "importer._PopulateTFImportGraphDefOptions": Support(_ALL_TF,
                                                         _ANY_KERAS),
    "TF_GraphImportGraphDefWithResults": Support(_ALL_TF, _ANY_KERAS),
    "Operation._from_c_op": Support(_ALL_TF, _ANY_KERAS),
    "Graph._names_in_use": Support(_ALL_TF, _ANY_KERAS),
    # ops
    "collective_ops (V2: all_reduce, all_gather, all_to_all, broadcast)":
        Support(_ALL_TF, _ANY_KERAS),
    "gen_math_ops, gen_nn_ops, gen_resource_variable_ops, gen_state_ops":
        Support(_ALL_TF, _ANY_KERAS),
    "tensor_util, control_flow_ops.switch, resource_variable_ops":
        Support(_ALL_TF, _ANY_KERAS),
    "ops.gradient_registry": Support(_ALL_TF, _ANY_KERAS),
    "_pywrap_util_port.IsMklEnabled": Support(_ALL_TF, _ANY_KERAS),
    # stats
    "ops.RegisterStatistics, flops_registry": Support(_ALL_TF, _ANY_KERAS),
    # targets: the hooks epl.hooks installs
    "Graph._create_op_helper": Support(_ALL_TF, _ANY_KERAS),
    "Graph.finalize": Support(_ALL_TF, _ANY_KERAS),
    "gradients_util._GradientsHelper": Support(_ALL_TF, _ANY_KERAS),
    "GradientTape.gradient": Support(_ALL_TF, _ANY_KERAS),
    "polymorphic_function.Function.__call__ (tf.function's callable); "
    "ConcreteFunction.graph.captures, structured_input_signature, "
    "structured_outputs (epl.runtime.traced_function)":
        Support(_ALL_TF, _ANY_KERAS),
    "compat.v1 Optimizer.apply_gradients, Optimizer._finish":
        Support(_ALL_TF, _ANY_KERAS),
    "BaseSession.__init__, BaseSession.run": Support(_ALL_TF, _ANY_KERAS),
    "dataset readers, Dataset.list_files, DatasetV1 iterators":
        Support(_ALL_TF, _ANY_KERAS),
    "Saver.save, EventFileWriter, training_util.write_graph":
        Support(_ALL_TF, _ANY_KERAS),
    "gen_math_ops.arg_max, equal; gen_nn_ops.top_kv2":
        Support(_ALL_TF, _ANY_KERAS),
    # keras
    "Layer.add_weight (base_layer, base_layer_v1), Dense.__call__":
        Support(_ALL_TF, _LEGACY_KERAS),
    "tensorflow.python.keras.engine base_layer(_v1).Layer.add_weight "
    "(TF's frozen Keras 2, under tensorflow.python.layers.base.Layer)":
        Support(_ALL_TF, "TensorFlow's own copy, hooked beside Keras 2 "
                "(bundled on 2.15, tf-keras 2.16-2.21); not keras3"),
    "Keras 2 Model.make_train_function, Model._train_counter, "
    "Model._steps_per_execution, training_v1.Model._make_train_function "
    "(epl.runtime.keras_fit)":
        Support(_ALL_TF, _LEGACY_KERAS),
    "keras3: Optimizer.apply, Model.fit, Model.train_on_batch (public; "
    "hooked to refuse them)": Support("2.16-2.21", "keras3 only"),
    # estimator
    "RunConfig.__init__, Estimator._call_model_fn, latest_checkpoint, "
    "evaluate": Support("2.15 (tensorflow-estimator; gone from 2.16)",
                        _ANY_KERAS),
    # horovod
    "horovod.tensorflow": Support("2.15 (Horovod 0.28.1 does not build "
                                  "against 2.21)", _ANY_KERAS),
}
