"""Shared test set-up: graph mode, quiet TensorFlow, EPL reset per test."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import epl  # noqa: E402
from tests import tf_versions  # noqa: E402

# EPL_TEST_TF1_BEHAVIOUR=1 (`make test-tf1`) runs the tests as a TF1 script
# ported to TF2 runs: `disable_v2_behavior()` gives reference variables
# (VariableV2) and v1 control flow; otherwise graph mode with TF2's
# resource variables and control flow v2.
TF1_BEHAVIOUR = os.environ.get("EPL_TEST_TF1_BEHAVIOUR") == "1"
if TF1_BEHAVIOUR:
  tf.compat.v1.disable_v2_behavior()
else:
  tf.compat.v1.disable_eager_execution()

# The equivalence tests `make test-tf1` (and CI) runs under
# EPL_TEST_TF1_BEHAVIOUR=1, as "file::test function": each feature trained
# with reference variables against plain TensorFlow, about 4 minutes on 2
# cores. Any test file also runs whole in that mode:
# EPL_TEST_TF1_BEHAVIOUR=1 python -m pytest tests/test_X.py.
TF1_BEHAVIOUR_TESTS = (
    "test_data_parallel.py::test_mean_matches_single_device",
    "test_data_parallel.py::test_reference_variable_updates_wait_for_their_reads",
    "test_loop_accumulation.py::test_loop_matches_single_device",
    "test_loop_accumulation.py::test_reference_variables_in_the_loop_match_single_device",
    "test_loop_accumulation.py::test_clipping_in_loop_keeps_its_semantics",
    "test_loop_accumulation.py::test_several_gradient_calls_accumulate_each",
    "test_data_parallel.py::test_sparse_gradients_with_different_row_counts_per_replica",
    "test_sessions_and_checkpoints.py::test_monitored_training_session_with_hooks",
    "test_sessions_and_checkpoints.py::test_data_parallel_checkpoint_restores_into_single_device",
    "test_sessions_and_checkpoints.py::test_initializable_iterator_and_gradient_apis",
    "test_pipeline.py::test_two_stages_two_replicas_on_four_devices",
    "test_pipeline.py::test_variables_slots_and_adam_powers_follow_their_stage",
    "test_gradient_checkpoint.py::test_micro_batches_and_replicas",
    "test_gradient_checkpoint.py::test_compute_gradients_and_tf_gradients",
    "test_amp.py::test_o1_four_replicas_and_micro_batches",
    "test_amp.py::test_dynamic_scale_with_adam_and_global_step",
    "test_split.py::test_split_head_matches_single_device",
    "test_split.py::test_checkpoints_hold_full_tensors_both_ways",
    "test_moe.py::test_split_experts_with_micro_batches",
    "test_memory_savers_zero.py::test_zero_matches_single_device",
    "test_memory_savers_zero.py::test_zero_v3_matches_single_device",
    "test_memory_savers_zero.py::test_zero_v3_with_a_fed_batch_read_by_a_partitioned_matmul",
    "test_fed_batches.py::test_fed_batch_micro_batches_run_as_a_loop",
    "test_memory_savers_zero.py::test_zero_v3_devices_hold_their_shards_only",
    "test_memory_savers_zero.py::test_offload_matches_single_device",
    "test_memory_savers_combined.py::test_gc_zero_amp_equal_amp_alone",
    "test_auto_parallel.py::test_mlp_equals_single_device",
    "test_random_and_state.py::test_batch_norm_statistics_move_by_the_mean_update",
)


def pytest_configure(config):
  config.addinivalue_line(
      "markers",
      "tf_before((major, minor), reason): the test needs a TensorFlow older "
      "than major.minor; on a newer one it skips, naming the version and "
      "the reason (tests/tf_versions.py)")
  config.addinivalue_line(
      "markers",
      "tf1_behaviour: the test is in the subset `make test-tf1` runs under "
      "EPL_TEST_TF1_BEHAVIOUR=1 (the equivalence tests)")
  config.addinivalue_line(
      "markers",
      "tf2_behaviour_only(reason): under EPL_TEST_TF1_BEHAVIOUR=1 the test "
      "skips, giving the reason")


def _mark_tf1_behaviour_tests(config, items):
  """Marks the tests of TF1_BEHAVIOUR_TESTS `tf1_behaviour`; when they are
  selected (`-m tf1_behaviour`), raises if one names no test of a file
  that was collected (a renamed test)."""
  listed = set(TF1_BEHAVIOUR_TESTS)
  found, files = set(), set()
  for item in items:
    files.add(item.path.name)
    name = "%s::%s" % (item.path.name, item.originalname)
    if name in listed:
      item.add_marker(pytest.mark.tf1_behaviour)
      found.add(name)
  missing = sorted(n for n in listed - found if n.split("::")[0] in files)
  if missing and "tf1_behaviour" in (config.getoption("markexpr") or ""):
    raise pytest.UsageError(
        "tests/conftest.py TF1_BEHAVIOUR_TESTS names no test: %s. Update "
        "the list." % ", ".join(missing))


def pytest_collection_modifyitems(config, items):
  _mark_tf1_behaviour_tests(config, items)
  for item in items:
    for mark in item.iter_markers("tf_before"):
      if tf_versions.TF >= tuple(mark.args[0]):
        item.add_marker(pytest.mark.skip(
            reason=tf_versions.skip_reason(mark.kwargs["reason"])))
    if TF1_BEHAVIOUR:
      for mark in item.iter_markers("tf2_behaviour_only"):
        item.add_marker(pytest.mark.skip(
            reason="EPL_TEST_TF1_BEHAVIOUR=1: " + mark.kwargs["reason"]))


@pytest.fixture(autouse=True)
def _fresh_epl():
  """Every test starts and ends without EPL hooks or state, and with an
  empty default graph (epl.init refuses one that already holds a model)."""
  epl.shutdown()
  tf.compat.v1.reset_default_graph()
  yield
  epl.shutdown()


@pytest.fixture(name="tf1_tensor_shapes")
def _tf1_tensor_shapes():
  """The test runs with TF1 tensor shapes, as after disable_v2_behavior():
  `shape[i]` is a `Dimension`, whose unknown size is not None. Under
  EPL_TEST_TF1_BEHAVIOUR=1 they stay on after the test."""
  already = tf.TensorShape([None])[0] is not None
  tf.compat.v1.disable_v2_tensorshape()
  yield
  if not already:
    tf.compat.v1.enable_v2_tensorshape()
