"""Tests of epl.config: defaults, sources, validation, reference table."""
import copy
import os
import pickle
import subprocess
import sys

import pytest

from epl.config import Config, config_keys, key_info, markdown_reference

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def clean_epl_env(monkeypatch):
  """No EPL_* variable from the outside leaks into a test."""
  for name in list(os.environ):
    if name.startswith("EPL_"):
      monkeypatch.delenv(name)


EXPECTED_DEFAULTS = {
    "auto.auto_parallel": False,
    "amp.level": "",
    "amp.dtype": "float16",
    "amp.debug_log": False,
    "amp.loss_scale": "dynamic",
    "io.slicing": False,
    "io.unbalanced_io_slicing": False,
    "io.drop_last_files": False,
    "zero.level": "",
    "zero.min_partition_size": 100000,
    "zero.prefetch_layers": 1,
    "offload.level": "",
    "communication.num_communicators": 2,
    "communication.local_cpu_reduce": True,
    "communication.shared_weights": True,
    "communication.sparse_as_dense": False,
    "communication.max_splits": 5,
    "communication.fp16": False,
    "communication.fp16_scale": 128.0,
    "communication.clip_after_allreduce": False,
    "communication.gradients_reduce_method": "mean",
    "communication.backend": "collective",
    "optimizer.num_apply_group": 1,
    "optimizer.grappler": "fast",
    "cluster.device_place_prefer_intra_node": True,
    "cluster.run_visible_devices": "",
    "cluster.colocate_split_and_replicate": False,
    "cluster.num_cpu_devices": None,
    "cluster.cpu_device_threads": None,
    "cluster.collective_timeout_seconds": 300.0,
    "gradient_checkpoint.type": "",
    "gradient_checkpoint.end_taskgraph": -1,
    "gradient_checkpoint.min_block_ops": 8,
    "gradient_checkpoint.check_gradients": False,
    "pipeline.num_micro_batch": 1,
    "pipeline.accumulation": "loop",
    "pipeline.num_stages": -1,
    "pipeline.strategy": "PreferBackward",
    "pipeline.virtual_stages": 1,
    "pipeline.activation_memory": 0.0,
    "log.passes": False,
}

BUILT_SECTIONS = {"pipeline", "communication", "io", "zero", "offload",
                  "optimizer", "gradient_checkpoint", "amp", "auto", "log"}
BUILT_CLUSTER_KEYS = {
    "cluster.num_cpu_devices", "cluster.collective_timeout_seconds",
    "cluster.device_place_prefer_intra_node", "cluster.run_visible_devices",
    "cluster.colocate_split_and_replicate"
}


# ---------------------------------------------------------------- defaults


def test_defaults():
  config = Config()
  assert config.to_dict() == EXPECTED_DEFAULTS
  assert config.pipeline.num_micro_batch == 1
  assert config.pipeline.strategy == "PreferBackward"
  assert config.communication.gradients_reduce_method == "mean"
  assert config.cluster.num_cpu_devices is None
  assert config.cluster.collective_timeout_seconds == 300.0
  assert config.get("zero.level") == ""
  assert Config(None) == Config({}) == config


# Keys of built sections whose own feature is not built yet.
UNBUILT_KEYS = set()


def test_built_flags():
  for info in config_keys():
    expected = (info.section in BUILT_SECTIONS or info.key in
                BUILT_CLUSTER_KEYS) and info.key not in UNBUILT_KEYS
    assert info.built == expected, info.key
    assert info.doc and "\n" not in info.doc


def test_key_info():
  info = key_info("pipeline.num_micro_batch")
  assert info.default == 1
  assert info.env_var == "EPL_PIPELINE_NUM_MICRO_BATCH"
  assert key_info("gradient_checkpoint.type").env_var == (
      "EPL_GRADIENT_CHECKPOINT_TYPE")
  with pytest.raises(ValueError, match="pipeline.num_micro_batch"):
    key_info("pipeline.num_micro_batches")


def mark_unbuilt(monkeypatch, key):
  """Every key is built today: the test marks one as not built."""
  from epl import config as config_module  # pylint: disable=import-outside-toplevel
  keys = config_module._KEYS  # pylint: disable=protected-access
  monkeypatch.setattr(config_module, "_KEYS", tuple(
      config_module.ConfigKey(k.section, k.name, k._kind, k.default, k.doc,  # pylint: disable=protected-access
                              False) if k.key == key else k for k in keys))


def test_unbuilt_settings(monkeypatch):
  mark_unbuilt(monkeypatch, "communication.num_communicators")
  assert Config().unbuilt_settings() == {}
  config = Config({"communication.num_communicators": 4, "zero.level": "v1",
                   "pipeline.num_micro_batch": 4})
  assert config.unbuilt_settings() == {"communication.num_communicators": 4}


# ----------------------------------------------------------------- sources


def test_dict_override():
  config = Config({
      "pipeline.num_micro_batch": 4,
      "communication.gradients_reduce_method": "sum",
      "cluster.num_cpu_devices": 8,
      "cluster.collective_timeout_seconds": 30,
      "amp.loss_scale": 1024,
      "cluster.run_visible_devices": "0, 2",
  })
  assert config.pipeline.num_micro_batch == 4
  assert config.communication.gradients_reduce_method == "sum"
  assert config.cluster.num_cpu_devices == 8
  # An int is accepted for a float key and stored as a float.
  assert config.cluster.collective_timeout_seconds == 30.0
  assert isinstance(config.cluster.collective_timeout_seconds, float)
  assert config.amp.loss_scale == 1024.0
  assert config.cluster.run_visible_devices == "0,2"
  # Everything else keeps its default.
  assert config.zero.level == ""


def test_env_override(monkeypatch):
  monkeypatch.setenv("EPL_PIPELINE_NUM_MICRO_BATCH", "4")
  monkeypatch.setenv("EPL_CLUSTER_NUM_CPU_DEVICES", "8")
  monkeypatch.setenv("EPL_CLUSTER_COLLECTIVE_TIMEOUT_SECONDS", "2.5")
  monkeypatch.setenv("EPL_COMMUNICATION_GRADIENTS_REDUCE_METHOD", "SUM")
  monkeypatch.setenv("EPL_GRADIENT_CHECKPOINT_TYPE", "auto")
  monkeypatch.setenv("EPL_AMP_LOSS_SCALE", "128")
  monkeypatch.setenv("EPL_ZERO_LEVEL", "v0")
  config = Config()
  assert config.pipeline.num_micro_batch == 4
  assert config.cluster.num_cpu_devices == 8
  assert config.cluster.collective_timeout_seconds == 2.5
  assert config.communication.gradients_reduce_method == "sum"
  assert config.gradient_checkpoint.type == "auto"
  assert config.amp.loss_scale == 128.0
  assert config.zero.level == "v0"


@pytest.mark.parametrize("text,expected", [
    ("true", True), ("True", True), ("TRUE", True), ("1", True),
    ("yes", True), ("YES", True), ("false", False), ("False", False),
    ("0", False), ("no", False), ("No", False),
])
def test_env_bool_spellings(monkeypatch, text, expected):
  monkeypatch.setenv("EPL_COMMUNICATION_FP16", text)
  monkeypatch.setenv("EPL_CLUSTER_DEVICE_PLACE_PREFER_INTRA_NODE", text)
  config = Config()
  assert config.communication.fp16 is expected
  assert config.cluster.device_place_prefer_intra_node is expected


def test_env_none_for_optional_int(monkeypatch):
  monkeypatch.setenv("EPL_CLUSTER_NUM_CPU_DEVICES", "none")
  assert Config().cluster.num_cpu_devices is None


def test_dict_beats_env(monkeypatch):
  monkeypatch.setenv("EPL_PIPELINE_NUM_MICRO_BATCH", "4")
  monkeypatch.setenv("EPL_PIPELINE_STRATEGY", "PreferForward")
  config = Config({"pipeline.num_micro_batch": 2})
  assert config.pipeline.num_micro_batch == 2
  # Keys the dict does not name still come from the environment.
  assert config.pipeline.strategy == "PreferForward"


def test_unrelated_env_vars_are_ignored(monkeypatch):
  monkeypatch.setenv("EPL_SOMETHING_ELSE", "1")
  monkeypatch.setenv("EPL_LAUNCHER_PORT", "1234")
  monkeypatch.setenv("EPLX_PIPELINE_NUM_MICRO_BATCH", "zero")
  monkeypatch.setenv("epl_pipeline_num_micro_batch", "zero")
  assert Config() == Config({})


# ------------------------------------------------------------------ errors


def test_unknown_key_suggests_closest():
  with pytest.raises(ValueError) as err:
    Config({"pipeline.num_micro_batches": 4})
  msg = str(err.value)
  assert "pipeline.num_micro_batches" in msg
  assert "4" in msg
  assert "Did you mean 'pipeline.num_micro_batch'" in msg


def test_unknown_key_without_section_suggests_full_key():
  with pytest.raises(ValueError, match="Did you mean 'pipeline.num_micro_batch'"):
    Config({"num_micro_batch": 4})


def test_unknown_section_lists_sections():
  with pytest.raises(ValueError, match="Known sections: .*pipeline"):
    Config({"nothing.at_all": 1})


def test_section_name_alone_is_an_unknown_key():
  with pytest.raises(ValueError, match="section.key"):
    Config({"pipeline": {"num_micro_batch": 2}})


@pytest.mark.parametrize("key,value,allowed", [
    ("pipeline.num_micro_batch", "4", "int >= 1"),
    ("pipeline.num_micro_batch", 4.0, "int >= 1"),
    ("pipeline.num_micro_batch", True, "int >= 1"),  # no bool for int keys
    ("communication.fp16", 1, "bool"),
    ("communication.fp16", "true", "bool"),
    ("cluster.collective_timeout_seconds", "30", "number > 0"),
    ("cluster.collective_timeout_seconds", True, "number > 0"),
    ("cluster.num_cpu_devices", 2.0, "int >= 1 or None"),
    ("pipeline.strategy", 1, "PreferBackward"),
    ("cluster.run_visible_devices", 0, "comma-separated"),
    ("amp.loss_scale", None, "dynamic"),
])
def test_wrong_type(key, value, allowed):
  with pytest.raises(ValueError) as err:
    Config({key: value})
  msg = str(err.value)
  assert key in msg
  assert repr(value) in msg
  assert allowed in msg


@pytest.mark.parametrize("key,value,allowed", [
    ("pipeline.num_micro_batch", 0, "int >= 1"),
    ("pipeline.num_micro_batch", -3, "int >= 1"),
    ("pipeline.num_stages", 0, "-1 (auto)"),
    ("pipeline.strategy", "Backward", "\"PreferBackward\", \"PreferForward\""),
    ("communication.gradients_reduce_method", "max", "\"mean\", \"sum\""),
    ("communication.num_communicators", 0, "int >= 1"),
    ("communication.fp16_scale", 0, "number > 0"),
    ("cluster.num_cpu_devices", 0, "int >= 1"),
    ("cluster.collective_timeout_seconds", 0.0, "number > 0"),
    ("cluster.collective_timeout_seconds", -1, "number > 0"),
    ("cluster.collective_timeout_seconds", float("inf"), "finite"),
    ("cluster.run_visible_devices", "gpu0", "comma-separated"),
    ("zero.level", "v4", "\"v0\""),
    ("amp.level", "O2", "\"O1\""),
    ("amp.loss_scale", -1, "dynamic"),
    ("amp.loss_scale", 0.5, "dynamic"),
    ("gradient_checkpoint.type", "manual", "\"collection\""),
    ("gradient_checkpoint.end_taskgraph", -2, "int >= -1"),
    ("gradient_checkpoint.min_block_ops", 0, "int >= 1"),
])
def test_invalid_value(key, value, allowed):
  with pytest.raises(ValueError) as err:
    Config({key: value})
  msg = str(err.value)
  assert key in msg
  assert repr(value) in msg
  assert allowed in msg


@pytest.mark.parametrize("var,text,allowed", [
    ("EPL_PIPELINE_NUM_MICRO_BATCH", "four", "int >= 1"),
    ("EPL_PIPELINE_NUM_MICRO_BATCH", "0", "int >= 1"),
    ("EPL_PIPELINE_NUM_MICRO_BATCH", "", "int >= 1"),
    ("EPL_COMMUNICATION_FP16", "maybe", "true/false/1/0/yes/no"),
    ("EPL_CLUSTER_COLLECTIVE_TIMEOUT_SECONDS", "soon", "number > 0"),
    ("EPL_CLUSTER_COLLECTIVE_TIMEOUT_SECONDS", "-5", "number > 0"),
    ("EPL_PIPELINE_STRATEGY", "sideways", "PreferForward"),
])
def test_bad_env_value(monkeypatch, var, text, allowed):
  monkeypatch.setenv(var, text)
  with pytest.raises(ValueError) as err:
    Config()
  msg = str(err.value)
  assert "environment variable " + var in msg
  assert repr(text) in msg
  assert allowed in msg
  # The dict does not excuse a bad environment value.
  with pytest.raises(ValueError, match=var):
    Config({"pipeline.num_micro_batch": 1})


def test_unknown_env_key_in_known_section(monkeypatch):
  monkeypatch.setenv("EPL_PIPELINE_NUM_MICRO_BATCHES", "4")
  with pytest.raises(ValueError) as err:
    Config()
  msg = str(err.value)
  assert "EPL_PIPELINE_NUM_MICRO_BATCHES" in msg
  assert "pipeline.num_micro_batches" in msg
  assert "'4'" in msg
  assert "pipeline.num_micro_batch" in msg
  assert "EPL_PIPELINE_NUM_MICRO_BATCH)" in msg


def test_unknown_env_key_in_multiword_section(monkeypatch):
  monkeypatch.setenv("EPL_GRADIENT_CHECKPOINT_TYP", "auto")
  with pytest.raises(ValueError, match="gradient_checkpoint.type"):
    Config()


def test_param_dict_must_be_a_mapping():
  with pytest.raises(ValueError, match="dict"):
    Config([("pipeline.num_micro_batch", 2)])


# --------------------------------------------------------- normalisation


@pytest.mark.parametrize("given,stored", [
    ("PreferBackward", "PreferBackward"),
    ("preferbackward", "PreferBackward"),
    ("PREFERBACKWARD", "PreferBackward"),
    ("PreferForward", "PreferForward"),
    ("preferForward", "PreferForward"),
    (" preferforward ", "PreferForward"),
    # The schedules' common names, as the README and docs call them.
    ("1F1B", "PreferBackward"),
    ("1f1b", "PreferBackward"),
    ("GPipe", "PreferForward"),
    ("gpipe", "PreferForward"),
])
def test_pipeline_strategy_is_case_insensitive(monkeypatch, given, stored):
  assert Config({"pipeline.strategy": given}).pipeline.strategy == stored
  monkeypatch.setenv("EPL_PIPELINE_STRATEGY", given)
  assert Config().pipeline.strategy == stored
  config = Config()
  config.pipeline.strategy = given.upper()
  assert config.pipeline.strategy == stored


def test_other_choices_are_normalised():
  config = Config({
      "communication.gradients_reduce_method": "Mean",
      "amp.level": "o1",
      "zero.level": "V1",
      "gradient_checkpoint.type": "AUTO",
      "amp.loss_scale": "Dynamic",
  })
  assert config.communication.gradients_reduce_method == "mean"
  assert config.amp.level == "O1"
  assert config.zero.level == "v1"
  assert config.gradient_checkpoint.type == "auto"
  assert config.amp.loss_scale == "dynamic"


# ------------------------------------------------------- attribute access


def test_attribute_set_validates():
  config = Config()
  config.pipeline.num_micro_batch = 8
  assert config.pipeline.num_micro_batch == 8
  assert config.get("pipeline.num_micro_batch") == 8
  with pytest.raises(ValueError, match=r"pipeline\.num_micro_batch.*int >= 1"):
    config.pipeline.num_micro_batch = 0
  with pytest.raises(ValueError, match="pipeline.num_micro_batch"):
    config.pipeline.num_micro_batch = True
  with pytest.raises(ValueError, match="cluster.collective_timeout_seconds"):
    config.cluster.collective_timeout_seconds = -1
  # A failed assignment leaves the old value.
  assert config.pipeline.num_micro_batch == 8
  config.cluster.collective_timeout_seconds = 5
  assert config.cluster.collective_timeout_seconds == 5.0


def test_attribute_set_unknown_key_suggests():
  config = Config()
  with pytest.raises(ValueError, match="Did you mean 'pipeline.num_micro_batch'"):
    config.pipeline.num_micro_batchs = 2
  assert not hasattr(config.pipeline, "num_micro_batchs")


def test_attribute_get_unknown():
  config = Config()
  with pytest.raises(AttributeError, match="pipeline.num_micro_batch"):
    _ = config.pipeline.num_micro_batches
  with pytest.raises(AttributeError, match="sections"):
    _ = config.pipelines
  with pytest.raises(AttributeError):
    config.pipeline = None


def test_get_and_set():
  config = Config()
  config.set("communication.max_splits", 3)
  assert config.get("communication.max_splits") == 3
  assert config.communication.max_splits == 3
  with pytest.raises(ValueError, match="communication.max_splits"):
    config.set("communication.max_splits", 0)
  with pytest.raises(ValueError, match="Did you mean 'communication.max_splits'"):
    config.get("communication.max_split")


# ---------------------------------------------- equality, copies, printing


def test_to_dict_round_trip():
  config = Config({
      "pipeline.num_micro_batch": 4,
      "pipeline.strategy": "preferforward",
      "cluster.num_cpu_devices": 2,
      "amp.loss_scale": 64,
  })
  flat = config.to_dict()
  assert list(flat) == [k.key for k in config_keys()]
  assert Config(flat) == config
  assert Config(config) == config
  assert Config(Config().to_dict()) == Config()


def test_equality():
  assert Config() == Config()
  assert Config({"pipeline.num_micro_batch": 2}) != Config()
  assert Config().pipeline == Config().pipeline
  assert Config().pipeline != Config().cluster
  assert Config() != {"pipeline.num_micro_batch": 1}


def test_copy_and_pickle_are_independent(monkeypatch):
  config = Config({"pipeline.num_micro_batch": 3})
  monkeypatch.setenv("EPL_PIPELINE_STRATEGY", "PreferForward")
  for other in (copy.copy(config), copy.deepcopy(config),
                pickle.loads(pickle.dumps(config))):
    assert other == config
    other.pipeline.num_micro_batch = 5
    assert config.pipeline.num_micro_batch == 3


def test_repr_is_readable():
  text = repr(Config({"pipeline.num_micro_batch": 4}))
  assert text.startswith("Config(")
  assert "pipeline(num_micro_batch=4" in text
  assert "strategy='PreferBackward'" in text
  for section in ("auto", "amp", "io", "zero", "offload", "communication",
                  "optimizer", "cluster", "gradient_checkpoint"):
    assert "\n  %s(" % section in text
  assert repr(Config().pipeline) == (
      "pipeline(num_micro_batch=1, accumulation='loop', num_stages=-1, "
      "strategy='PreferBackward', "
      "virtual_stages=1, activation_memory=0.0)")


# ---------------------------------------------------------- reference table


def test_markdown_reference_lists_every_key():
  table = markdown_reference()
  lines = table.strip().splitlines()
  assert lines[0] == "| Key | Type | Default | Built | Meaning |"
  assert len(lines) == 2 + len(EXPECTED_DEFAULTS)
  for key, line in zip(EXPECTED_DEFAULTS, lines[2:]):
    assert line.startswith("| `%s` |" % key)
    assert line.count(" | ") == 4  # five cells, no stray pipes
  assert "| `pipeline.num_micro_batch` | int >= 1 | `1` | yes |" in table
  assert "| `zero.level` |" in table


def test_docs_have_current_reference_table():
  with open(os.path.join(REPO_ROOT, "docs", "config.md")) as f:
    page = f.read()
  assert markdown_reference() in page, (
      "docs/config.md's configuration table is out of date: replace it with "
      "the output of `python -m epl.config`.")


def test_module_prints_reference():
  out = subprocess.run([sys.executable, "-m", "epl.config"], cwd=REPO_ROOT,
                       capture_output=True, text=True, check=True,
                       timeout=300).stdout
  assert out == markdown_reference()
