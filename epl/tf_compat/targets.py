"""The TensorFlow entry points EPL wraps, as (owner, attribute) pairs.

`epl.hooks` installs a wrapper on each; what a wrapper does is documented
there. Most owners are private classes or modules: the public API calls
them (`tf.gradients` calls `gradients_util._GradientsHelper`, every op is
made through `Graph._create_op_helper`), so wrapping the public name alone
would miss calls. tests/test_tf_compat.py checks that each still is what
the public API reaches.
"""
# First: checks the TensorFlow version before its internals are imported.
from epl.tf_compat import version_check  # noqa: F401  pylint: disable=unused-import
from tensorflow.python.client import session as session_lib
from tensorflow.python.data.ops import dataset_ops
from tensorflow.python.data.ops import readers
from tensorflow.python.eager import backprop
from tensorflow.python.eager.polymorphic_function import polymorphic_function
from tensorflow.python.framework import ops
from tensorflow.python.ops import gen_math_ops
from tensorflow.python.ops import gen_nn_ops
from tensorflow.python.ops import gradients_util
from tensorflow.python.summary.writer import writer as summary_writer
from tensorflow.python.training import optimizer as optimizer_lib
from tensorflow.python.training import saver as saver_lib
from tensorflow.python.training import training_util

# Every op of every graph is made through it.
CREATE_OP = (ops.Graph, "_create_op_helper")
GRAPH_FINALIZE = (ops.Graph, "finalize")
# Behind tf.gradients, Optimizer.compute_gradients and minimize.
GRADIENTS = (gradients_util, "_GradientsHelper")
# Makes the seeds (ones) of the gradients of the losses: EPL records them as
# the losses' seeds, which AMP's loss scale multiplies.
DEFAULT_GRAD_YS = (gradients_util, "_DefaultGradYs")
TAPE_GRADIENT = (backprop.GradientTape, "gradient")
# tf.compat.v1.train.Optimizer (all TF1 optimizers).
APPLY_GRADIENTS = (optimizer_lib.Optimizer, "apply_gradients")
SESSION_INIT = (session_lib.BaseSession, "__init__")
SESSION_RUN = (session_lib.BaseSession, "run")
# The file-based datasets: tf.data.TFRecordDataset and the others are
# wrappers that make one of these.
DATASET_READERS = ((readers.TFRecordDatasetV2, "__init__"),
                   (readers.TextLineDatasetV2, "__init__"),
                   (readers.FixedLengthRecordDatasetV2, "__init__"))
# A static method.
LIST_FILES = (dataset_ops.DatasetV2, "list_files")
# Behind tf.compat.v1.data.make_one_shot_iterator and
# make_initializable_iterator.
DATASET_ITERATORS = ((dataset_ops.DatasetV1, "_make_one_shot_iterator"),
                     (dataset_ops.DatasetV1, "_make_initializable_iterator"))
SAVER_SAVE = (saver_lib.Saver, "save")
SAVER_RESTORE = (saver_lib.Saver, "restore")
# FileWriter makes its EventFileWriter through this module attribute.
EVENT_FILE_WRITER = (summary_writer, "EventFileWriter")
# What CheckpointSaverHook (MonitoredTrainingSession with a checkpoint_dir)
# writes graph.pbtxt with; tf.io.write_graph is the same function.
WRITE_GRAPH = (training_util, "write_graph")
# The generated wrappers behind tf.argmax, tf.equal and tf.math.top_k.
ARG_MAX = (gen_math_ops, "arg_max")
EQUAL = (gen_math_ops, "equal")
TOP_K = (gen_nn_ops, "top_kv2")
# tf.function's callable: a call made eagerly runs the traced step, which
# EPL replaces by its rewrite (epl.runtime.traced_function).
FUNCTION_CALL = (polymorphic_function.Function, "__call__")
