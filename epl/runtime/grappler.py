"""The Grappler preset EPL hands every session (config key
`optimizer.grappler`).

Grappler, TensorFlow's graph optimiser, runs over the whole graph before a
session's first run of it. EPL's graph of R replicas x M micro-batches is
about R x M times the user's, and Grappler's default passes then take most
of the time to the first step while buying little step time on it
(benchmarks/grappler.py; docs/sessions.md#grappler). The "fast" preset
switches off the passes that cost the most for what they buy; "default"
leaves TensorFlow's own.

Where TensorFlow runs its oneDNN rewrites (x86 CPUs, unless
TF_ENABLE_ONEDNN_OPTS=0), the preset leaves the arithmetic optimizer on.
Without it, TF 2.15's remapper aborts the process on graphs EPL makes with
recomputation (BERT's layer norms recomputed by gradient_checkpoint
"auto"): its oneDNN instance-norm match (`FindInstanceNorm`, seen in the
backtrace) reads the `value` attribute of a node of a layer-norm pattern
that is no constant (`libprotobuf FATAL ... key not found: value`, then a
segmentation fault in Session.run). TensorFlow's default arithmetic pass
rewrites those patterns before the remapper sees them, which is the path
plain TensorFlow always takes; keeping TensorFlow's default there stops
the crash (tests/test_grappler_preset.py, which fails without this on such
CPUs).

EPL never overrides what the user chose: a field of the session's
RewriterConfig the user set to anything but its default keeps the user's
value, and a session config that turns the meta-optimizer off or lists its
optimizers by name (`rewrite_options.optimizers`) is left as it is.
"""
from epl.tf_compat import ops

# RewriterConfig field -> the name of its value under the "fast" preset.
# Chosen from benchmarks/grappler.py on tiny BERT, 8 replicas x 4
# micro-batches: each of these costs first-step time out of proportion to
# the step time it buys there (docs/sessions.md#grappler has the table).
# The layout optimizer (NCHW convolutions) and the implementation selector
# (cuDNN RNNs) stay: what they buy is on GPUs, where this was not measured.
# Constant folding stays too, though it costs the most: without it, constants
# such as BERT's attention scale are computed by other kernels than in the
# user's single-device run, and the weights drift from it by more than float
# noise (tests/test_auto_parallel.py::test_bert_equals_single_device).
FAST = {
    "meta_optimizer_iterations": "ONE",
    "arithmetic_optimization": "OFF",
    "memory_optimization": "NO_MEM_OPT",
    "loop_optimization": "OFF",
    "disable_tfg_optimizer": True,
}

# Fields of FAST that stay at TensorFlow's default while its oneDNN
# rewrites run (see the module docstring).
ONEDNN_UNSAFE = ("arithmetic_optimization",)


def preset_fields(preset):
  """{field: value name} that `preset` sets in this process."""
  if preset == "default":
    return {}
  if ops.onednn_graph_rewrites():
    return {field: name for field, name in FAST.items()
            if field not in ONEDNN_UNSAFE}
  return dict(FAST)


def _value(rewrite_options, field, name):
  """The number of enum value `name` of `field`, or `name` for a scalar."""
  enum = rewrite_options.DESCRIPTOR.fields_by_name[field].enum_type
  if enum is None:
    return name
  return enum.values_by_name[name].number


def apply_preset(preset, rewrite_options):
  """Sets `preset`'s Grappler fields on `rewrite_options` (a
  RewriterConfig, changed in place) where the user left them at their
  default; returns the names of the fields it set. `preset` is a value
  of the config key, checked there ("default" or "fast")."""
  if (preset == "default" or rewrite_options.disable_meta_optimizer or
      rewrite_options.optimizers):
    return []
  changed = []
  for field, name in preset_fields(preset).items():
    default = rewrite_options.DESCRIPTOR.fields_by_name[field].default_value
    if getattr(rewrite_options, field) == default:
      setattr(rewrite_options, field, _value(rewrite_options, field, name))
      changed.append(field)
  return changed
