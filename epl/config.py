"""EPL configuration: every knob, its default, its type and where it comes from.

A key is written ``section.key`` (``pipeline.num_micro_batch``). Its value is,
in order of precedence:

1. the ``param_dict`` given to :class:`Config`,
2. the environment variable ``EPL_<SECTION>_<KEY>`` (upper case, e.g.
   ``EPL_PIPELINE_NUM_MICRO_BATCH=4``), parsed to the key's type,
3. the key's default.

Every value is checked when it is set, including later assignments such as
``config.pipeline.num_micro_batch = 0``; a bad one raises ``ValueError``
naming the key, the value and what is allowed.

The keys and defaults follow Alibaba's original EPL. Keys whose feature is not
built yet are accepted (so existing scripts keep working) and reported by
:meth:`Config.unbuilt_settings`. ``python -m epl.config`` prints the reference
table that docs/config.md carries.
"""

import difflib
import math
import numbers
import os
import re
from collections.abc import Mapping

__all__ = [
    "Config",
    "ConfigKey",
    "config_keys",
    "key_info",
    "markdown_reference",
    "ENV_PREFIX",
]

ENV_PREFIX = "EPL_"

_NOT_BUILT = "accepted, not built yet"


class _Invalid(Exception):
  """Raised by a key's checker; carries what would have been allowed."""


# --------------------------------------------------------------------------
# Value kinds. Each one knows how to check a Python value (returning the
# normalised value), how to parse an environment string, and how to describe
# what it allows.
# --------------------------------------------------------------------------


class _Kind:
  """Base of the value kinds."""

  type_text = ""  # short text for the reference table
  allowed = ""  # what the error message says is allowed

  def check(self, value):
    raise NotImplementedError

  def parse(self, text):
    """Turns an environment string into a value that `check` then validates."""
    return text


class _Bool(_Kind):
  _TRUE = ("true", "1", "yes")
  _FALSE = ("false", "0", "no")

  type_text = "bool"
  allowed = "a bool (True or False)"

  def check(self, value):
    if isinstance(value, bool):
      return value
    raise _Invalid(self.allowed)

  def parse(self, text):
    word = text.strip().lower()
    if word in self._TRUE:
      return True
    if word in self._FALSE:
      return False
    raise _Invalid("a bool: one of true/false/1/0/yes/no, any case")


class _Int(_Kind):
  """An int (never a bool) with an optional lower bound and extra values."""

  def __init__(self, minimum=None, optional=False, special=None):
    self.minimum = minimum
    self.optional = optional
    self.special = dict(special or {})  # value -> what it means
    parts = []
    if minimum is not None:
      parts.append("int >= %d" % minimum)
    else:
      parts.append("int")
    for value, meaning in self.special.items():
      parts.append("%d (%s)" % (value, meaning))
    if optional:
      parts.append("None")
    self.type_text = " or ".join(parts)
    self.allowed = "an " + self.type_text

  def check(self, value):
    if value is None and self.optional:
      return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
      raise _Invalid(self.allowed)
    value = int(value)
    if value in self.special:
      return value
    if self.minimum is not None and value < self.minimum:
      raise _Invalid(self.allowed)
    return value

  def parse(self, text):
    word = text.strip()
    if self.optional and word.lower() in ("", "none"):
      return None
    try:
      return int(word)
    except ValueError:
      raise _Invalid(self.allowed)


class _PositiveFloat(_Kind):
  """A finite number > 0; with `zero_means`, also 0, which means that."""

  def __init__(self, zero_means=None):
    self.zero_means = zero_means
    self.type_text = "float > 0"
    self.allowed = "a finite number > 0 (int or float)"
    if zero_means is not None:
      self.type_text += " or 0 (%s)" % zero_means
      self.allowed = "a finite number >= 0 (int or float; 0: %s)" % (
          zero_means)

  def check(self, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
      raise _Invalid(self.allowed)
    value = float(value)
    if value == 0 and self.zero_means is not None:
      return value
    if not math.isfinite(value) or value <= 0:
      raise _Invalid(self.allowed)
    return value

  def parse(self, text):
    try:
      return float(text.strip())
    except ValueError:
      raise _Invalid(self.allowed)


# A size in bytes: a number and a unit (decimal kB/MB/GB/TB or binary
# KiB/MiB/GiB/TiB, or B), any case, a space allowed between.
_BYTE_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE_PATTERN = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]+)\s*$",
                           re.IGNORECASE)


def size_in_bytes(text):
  """The bytes `text` names ("512MB", "2 GiB"); None when it is not a
  number followed by one of the units."""
  match = _SIZE_PATTERN.match(text) if isinstance(text, str) else None
  if match is None or match.group(2).lower() not in _BYTE_UNITS:
    return None
  return int(float(match.group(1)) * _BYTE_UNITS[match.group(2).lower()])


class _FractionOrSize(_PositiveFloat):
  """A finite number >= 0 (0: `zero_means`), or a size in bytes written
  with its unit ("512MB", "2GiB"), kept as written (stripped)."""

  def __init__(self, zero_means):
    super().__init__(zero_means=zero_means)
    self.type_text += " or str: bytes with a unit (\"512MB\", \"2GiB\")"
    self.allowed += (" or a str of bytes > 0 with a unit: B, kB, MB, GB, "
                     "TB, KiB, MiB, GiB or TiB (\"512MB\", \"2GiB\")")

  def check(self, value):
    if isinstance(value, str):
      if not size_in_bytes(value):
        raise _Invalid(self.allowed)
      return value.strip()
    return super().check(value)

  def parse(self, text):
    return text if size_in_bytes(text) is not None else super().parse(text)


class _Choice(_Kind):
  """One of a few strings, matched case-insensitively, stored canonically.

  `aliases` ({alias: option}) are other names accepted for an option and
  stored as that option.
  """

  def __init__(self, options, aliases=None):
    self.options = tuple(options)
    aliases = dict(aliases or {})
    self._by_lower = {o.lower(): o for o in self.options}
    self._by_lower.update((a.lower(), o) for a, o in aliases.items())
    shown = ", ".join('"%s"' % o for o in self.options)
    if aliases:
      shown += " (aliases: %s)" % ", ".join(
          '"%s" for "%s"' % item for item in aliases.items())
    self.type_text = "one of " + shown
    self.allowed = "one of " + shown + " (any case)"

  def check(self, value):
    if isinstance(value, str):
      canonical = self._by_lower.get(value.strip().lower())
      if canonical is not None:
        return canonical
    raise _Invalid(self.allowed)


class _DeviceList(_Kind):
  """Comma-separated device indices, or empty for all devices."""

  _PATTERN = re.compile(r"^\s*(\d+\s*(,\s*\d+\s*)*)?$")
  type_text = "str: device indices like \"0,1\", or \"\""
  allowed = 'a str of comma-separated device indices such as "0,1,3", or "" for all'

  def check(self, value):
    if isinstance(value, str) and self._PATTERN.match(value):
      return ",".join(p.strip() for p in value.split(",")) if value.strip() else ""
    raise _Invalid(self.allowed)


class _LossScale(_Kind):
  type_text = "\"dynamic\" or float >= 1"
  allowed = 'the str "dynamic" or a finite number >= 1'

  def check(self, value):
    if isinstance(value, str):
      word = value.strip()
      if word.lower() == "dynamic":
        return "dynamic"
      try:
        value = float(word)
      except ValueError:
        raise _Invalid(self.allowed)
    try:
      value = _PositiveFloat().check(value)
    except _Invalid:
      raise _Invalid(self.allowed)
    if value < 1:
      raise _Invalid(self.allowed)
    return value


# --------------------------------------------------------------------------
# The keys.
# --------------------------------------------------------------------------


class ConfigKey:
  """Description of one configuration key (read-only)."""

  __slots__ = ("section", "name", "default", "doc", "built", "_kind")

  def __init__(self, section, name, kind, default, doc, built):
    object.__setattr__(self, "section", section)
    object.__setattr__(self, "name", name)
    object.__setattr__(self, "_kind", kind)
    object.__setattr__(self, "doc", doc)
    object.__setattr__(self, "built", built)
    object.__setattr__(self, "default", kind.check(default))

  def __setattr__(self, name, value):
    raise AttributeError("ConfigKey is read-only")

  @property
  def key(self):
    """The full ``section.key`` name."""
    return "%s.%s" % (self.section, self.name)

  @property
  def env_var(self):
    """The environment variable that sets this key."""
    return (ENV_PREFIX + self.section + "_" + self.name).upper()

  @property
  def type_text(self):
    return self._kind.type_text

  @property
  def allowed(self):
    return self._kind.allowed

  def __repr__(self):
    return "ConfigKey(%s, default=%r, built=%s)" % (self.key, self.default,
                                                   self.built)


# The schedules that place two stages per device in a V (ZB-V, V-Half,
# V-Min): they imply pipeline.virtual_stages 2 (`stages_per_device`).
_V_SHAPED_SCHEDULES = ("ZeroBubbleV", "ZeroBubbleVHalf", "ZeroBubbleVMin")


def stages_per_device(config):
  """The stages a pipeline device holds under `config`:
  pipeline.virtual_stages, which the V-shaped schedule implies to be 2
  (the planner checks a written value against it)."""
  if config.pipeline.strategy in _V_SHAPED_SCHEDULES:
    return max(config.pipeline.virtual_stages, 2)
  return config.pipeline.virtual_stages


def _k(section, name, kind, default, doc, built=False):
  return ConfigKey(section, name, kind, default, doc, built)


_KEYS = (
    # auto
    _k("auto", "auto_parallel", _Bool(), False,
       "Let EPL choose the parallel strategy itself: data parallel, cut "
       "into pipeline.num_stages stages balanced by FLOPs when that is > 1 "
       "(num_stages x pipeline.virtual_stages, v per device, with "
       "virtual_stages > 1); the model has no strategy scope.", built=True),
    # amp
    _k("amp", "level", _Choice(["", "O1"]), "",
       "Automatic mixed precision level; \"\" is off, \"O1\" runs "
       "compute-heavy ops in half precision with float32 weights.",
       built=True),
    _k("amp", "dtype", _Choice(["float16", "bfloat16"]), "float16",
       "Half-precision type of AMP; \"bfloat16\" needs no loss scale.",
       built=True),
    _k("amp", "debug_log", _Bool(), False,
       "Log what automatic mixed precision changes.", built=True),
    _k("amp", "loss_scale", _LossScale(), "dynamic",
       "Loss scaling for float16 AMP: \"dynamic\", or a fixed factor >= 1.",
       built=True),
    # io
    _k("io", "slicing", _Bool(), False,
       "Shard the input files across workers automatically (remove your own "
       "sharding when on).", built=True),
    _k("io", "unbalanced_io_slicing", _Bool(), False,
       "Allow workers to get different numbers of files when slicing.",
       built=True),
    _k("io", "drop_last_files", _Bool(), False,
       "Drop the files left over so every worker gets as many files.",
       built=True),
    # zero
    _k("zero", "level", _Choice(["", "v0", "v1", "v2", "v3"]), "",
       "ZeRO memory partitioning over data-parallel replicas; \"v0\" "
       "optimizer states, \"v1\" also gradients (reduced on their owner), "
       "\"v2\" also the micro-batch sums of gradients (on their owner "
       "only); \"v3\" also the weights (each replica stores one shard of "
       "each, gathered just before use); \"\" is off.",
       built=True),
    _k("zero", "min_partition_size", _Int(minimum=0), 100000,
       "zero.level \"v3\": variables with fewer elements stay whole on every "
       "replica (their optimizer state and gradients partitioned as with "
       "\"v2\"); DeepSpeed's stage3_param_persistence_threshold.",
       built=True),
    _k("zero", "prefetch_layers", _Int(minimum=1), 1,
       "zero.level \"v3\": how many uses of partitioned weights (layers) "
       "ahead of its use each weight's all-gather starts; a device holds "
       "up to this many gathered weights besides the one in use.",
       built=True),
    # offload
    _k("offload", "level", _Choice(["", "v0"]), "",
       "Offload to host memory; \"v0\" puts variables, optimizer state and "
       "updates on the host CPU; \"\" is off.", built=True),
    # communication
    _k("communication", "num_communicators", _Int(minimum=1), 2,
       "Number of independent collective groups the gradient buckets are "
       "dealt to, round-robin in the order backward makes them; buckets of "
       "one group run in order, groups may run at the same time.",
       built=True),
    _k("communication", "local_cpu_reduce", _Bool(), True,
       "When every replica is a CPU device of one process, all-reduce "
       "gradients by a sum on one device that every replica reads (as "
       "MirroredStrategy does there) instead of a ring of collective ops.",
       built=True),
    _k("communication", "shared_weights", _Bool(), True,
       "With the local sums of communication.local_cpu_reduce (every "
       "replica a CPU device of one process), the replicas read one copy "
       "of each trained variable and its optimizer state, updated once "
       "per step, instead of a copy each that every replica updates.",
       built=True),
    _k("communication", "sparse_as_dense", _Bool(), False,
       "Turn sparse gradients (IndexedSlices) into dense tensors before "
       "communicating them.", built=True),
    _k("communication", "max_splits", _Int(minimum=1), 5,
       "Most groups the gradients are fused into for all-reduce (not used "
       "by the local sums of communication.local_cpu_reduce).",
       built=True),
    _k("communication", "fp16", _Bool(), False,
       "Cast gradients to float16 for communication.", built=True),
    _k("communication", "fp16_scale", _PositiveFloat(), 128.0,
       "Factor gradients are multiplied by before the float16 cast and "
       "divided by after.", built=True),
    _k("communication", "clip_after_allreduce", _Bool(), False,
       "Apply gradient clipping after the all-reduce instead of before.",
       built=True),
    _k("communication", "gradients_reduce_method", _Choice(["mean", "sum"]),
       "mean", "How gradients are combined across replicas.", built=True),
    _k("communication", "backend", _Choice(["collective", "horovod"]),
       "collective",
       "How replicas communicate: \"collective\" (TensorFlow collective ops;"
       " workers from TF_CONFIG) or \"horovod\" (Horovod ops; one worker "
       "per process started by horovodrun).", built=True),
    # optimizer
    _k("optimizer", "num_apply_group", _Int(minimum=1), 1,
       "Apply the gradients in this many groups, one after another, to "
       "lower peak memory.", built=True),
    _k("optimizer", "grappler", _Choice(["default", "fast"]), "fast",
       "Grappler (TensorFlow's graph optimiser) preset of every session: "
       "\"fast\" runs fewer of its passes, which on EPL's large replicated "
       "graphs cost most of the time to the first step and buy little "
       "step time; \"default\" is TensorFlow's. Fields the user sets in "
       "the session's RewriterConfig win.", built=True),
    # cluster
    _k("cluster", "device_place_prefer_intra_node", _Bool(), True,
       "Prefer placing one model replica within a single node.", built=True),
    _k("cluster", "run_visible_devices", _DeviceList(), "",
       "Devices this worker may use, usually set by the scheduler; \"\" "
       "means all.", built=True),
    _k("cluster", "colocate_split_and_replicate", _Bool(), False,
       "Place split and replicate TaskGraphs on the same devices; epl.split "
       "needs it (an error otherwise).", built=True),
    _k("cluster", "num_cpu_devices", _Int(minimum=1, optional=True), None,
       "Logical CPU devices per worker when no GPU is present; None means 1.",
       built=True),
    _k("cluster", "cpu_device_threads", _Int(minimum=0, optional=True), None,
       "Intra-op threads of each logical CPU device: None lets epl.init "
       "choose, 0 keeps TensorFlow's one pool shared by the devices, k gives "
       "each device k (docs/data_parallel.md)."),
    _k("cluster", "collective_timeout_seconds", _PositiveFloat(), 300.0,
       "A dead peer becomes an error after this many seconds.", built=True),
    # gradient_checkpoint
    _k("gradient_checkpoint", "type", _Choice(["", "collection", "auto"]), "",
       "Recomputation: \"collection\" uses the tensors you collected, "
       "\"auto\" picks them; \"\" is off.", built=True),
    _k("gradient_checkpoint", "end_taskgraph", _Int(minimum=-1), -1,
       "Last TaskGraph that automatic recomputation covers; -1 is the last.",
       built=True),
    _k("gradient_checkpoint", "min_block_ops", _Int(minimum=1), 8,
       "\"auto\": a repeated name scope (a layer_0, layer_1, ... block) "
       "needs this many forward ops to count as a block whose output is a "
       "checkpoint; with no such block, checkpoints are spread evenly by "
       "activation bytes.", built=True),
    _k("gradient_checkpoint", "check_gradients", _Bool(), False,
       "Compare recomputed gradients with plain ones (for debugging).",
       built=True),
    # pipeline
    _k("pipeline", "num_micro_batch", _Int(minimum=1), 1,
       "Micro-batches per step in pipeline parallelism (gradient "
       "accumulation without pipeline).", built=True),
    _k("pipeline", "accumulation", _Choice(["copies", "loop"]), "loop",
       "How a single stage runs its num_micro_batch micro-batches: "
       "\"loop\", a while-loop over one copy of the forward and backward "
       "pass (the graph does not grow with the micro-batches; what cannot "
       "run in the loop runs as copies, with a warning saying why), or "
       "\"copies\", one copy per micro-batch. Pipelines always copy.",
       built=True),
    _k("pipeline", "num_stages", _Int(minimum=1, special={-1: "auto"}), -1,
       "Number of pipeline stages: auto.auto_parallel cuts the model into "
       "this many (the devices of a pipeline: it cuts num_stages x "
       "pipeline.virtual_stages); with stage scopes written by hand, their "
       "count (-1: any).",
       built=True),
    _k("pipeline", "strategy",
       _Choice(["PreferBackward", "PreferForward", "PreferBackwardOptimizer",
                "ZeroBubble"] + list(_V_SHAPED_SCHEDULES),
               aliases={"1F1B": "PreferBackward", "GPipe": "PreferForward",
                        "ZB-H1": "ZeroBubble", "ZB-V": "ZeroBubbleV",
                        "V-Half": "ZeroBubbleVHalf",
                        "V-Min": "ZeroBubbleVMin"}),
       "PreferBackward",
       "Pipeline schedule: \"PreferBackward\" (1F1B), \"PreferForward\" "
       "(GPipe), \"PreferBackwardOptimizer\" (1F1B with one more forward "
       "in flight on every stage but the last), \"ZeroBubble\" (ZB-H1: "
       "each backward split into input and weight gradients, the weight "
       "gradients deferred into the bubble) or \"ZeroBubbleV\" (ZB-V: "
       "the same split, 2p stage scopes on p devices per pipeline, device "
       "d holding stages d and 2p - 1 - d; implies "
       "pipeline.virtual_stages 2; needs num_micro_batch >= 2p - 1); "
       "\"ZeroBubbleVHalf\" and \"ZeroBubbleVMin\" place the stages the "
       "same way, each device holding at most V-Half's (p + 2) / 2 or "
       "V-Min's (p + 4) / 3 micro-batches of activations of its model "
       "part (1F1B: p), in a greedy order with more bubble.",
       built=True),
    _k("pipeline", "virtual_stages", _Int(minimum=1), 1,
       "Stages per pipeline device (v): with v > 1, the S stage scopes run "
       "on S / v devices per replica, stage s on device s mod (S / v), "
       "under Megatron-LM's interleaved 1F1B; needs pipeline.strategy "
       "\"PreferBackward\" and num_micro_batch a multiple of S / v, or "
       "\"ZeroBubbleV\" (which implies v = 2, stages placed in a V). Auto "
       "parallel cuts S = pipeline.num_stages x v stages.",
       built=True),
    _k("pipeline", "activation_memory", _FractionOrSize(zero_means="off"),
       0.0,
       "A budget for the activations each pipeline device holds, as a "
       "multiple of what 1F1B holds on the same devices (1: as much, 0.5: "
       "half), or in bytes per device with a unit (\"512MB\", \"2GiB\"; "
       "counted from the built step's static shapes): EPL then chooses pipeline.strategy itself, the schedule with "
       "the least bubble (simulated with F = B = W) among those that place "
       "the stage scopes as the configuration does (one per device: GPipe, "
       "1F1B, ZB-H1; two, with pipeline.virtual_stages 2 or a V schedule: "
       "interleaved 1F1B, ZB-V, V-Half, V-Min) and hold no more than the "
       "budget; epl-plan prints the choice and why.", built=True),
    # log
    _k("log", "passes", _Bool(), False,
       "Log each rewrite pass at INFO: whether it ran, the ops it added and "
       "the time it took.", built=True),
)

_KEYS_BY_NAME = {k.key: k for k in _KEYS}
_SECTIONS = {}
for _key in _KEYS:
  _SECTIONS.setdefault(_key.section, {})[_key.name] = _key
del _key


def config_keys():
  """All keys, in reference-table order, as :class:`ConfigKey` objects."""
  return list(_KEYS)


def key_info(key):
  """The :class:`ConfigKey` for ``"section.key"``; ``ValueError`` if unknown."""
  info = _KEYS_BY_NAME.get(key)
  if info is None:
    raise ValueError(_unknown_key_message(key))
  return info


# --------------------------------------------------------------------------
# Error messages.
# --------------------------------------------------------------------------


def _suggest(key):
  """Closest known ``section.key`` to `key`, or None."""
  if not isinstance(key, str):
    return None
  candidates = list(_KEYS_BY_NAME)
  match = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
  if match:
    return match[0]
  # Try the key part alone (e.g. "num_micro_batch" or a wrong section).
  tail = key.rsplit(".", 1)[-1]
  by_tail = {}
  for k in _KEYS:
    by_tail.setdefault(k.name, k.key)
  match = difflib.get_close_matches(tail, list(by_tail), n=1, cutoff=0.75)
  if match:
    return by_tail[match[0]]
  return None


def _unknown_key_message(key, value=None, has_value=False, env_var=None):
  where = ""
  if env_var is not None:
    where = " (from environment variable %s)" % env_var
  msg = "Unknown EPL config key %r%s" % (key, where)
  if has_value:
    msg += " with value %r" % (value,)
  msg += "."
  is_section = isinstance(key, str) and key in _SECTIONS
  suggestion = None if is_section else _suggest(key)
  if suggestion is not None:
    if env_var is not None:
      msg += " Did you mean %r (environment variable %s)?" % (
          suggestion, _KEYS_BY_NAME[suggestion].env_var)
    else:
      msg += " Did you mean %r?" % suggestion
  section = key.split(".", 1)[0] if isinstance(key, str) else None
  if section in _SECTIONS:
    if is_section:
      msg += " Keys are written \"section.key\"."
    msg += " Keys of section %r: %s." % (section, ", ".join(_SECTIONS[section]))
  else:
    msg += " Known sections: %s." % ", ".join(_SECTIONS)
  return msg


def _invalid_message(info, value, allowed, env_var=None):
  where = ""
  if env_var is not None:
    where = " from environment variable %s" % env_var
  return "Invalid value %r (%s) for EPL config key %r%s; allowed: %s." % (
      value, type(value).__name__, info.key, where, allowed)


def _check(info, value, env_var=None):
  try:
    return info._kind.check(value)
  except _Invalid as e:
    raise ValueError(_invalid_message(info, value, e.args[0], env_var)) from None


def _parse_env(info, env_var, text):
  # Errors show the variable's text as it was written.
  try:
    return info._kind.check(info._kind.parse(text))
  except _Invalid as e:
    raise ValueError(_invalid_message(info, text, e.args[0], env_var)) from None


def _env_values(environ):
  """{key: value} from ``EPL_<SECTION>_<KEY>`` variables in `environ`.

  Variables whose name does not start with a known section are ignored; a
  known section with an unknown key is an error.
  """
  sections = sorted(_SECTIONS, key=len, reverse=True)  # longest prefix first
  values = {}
  for var in sorted(environ):
    if not var.startswith(ENV_PREFIX):
      continue
    rest = var[len(ENV_PREFIX):]
    for section in sections:
      prefix = section.upper() + "_"
      if rest.startswith(prefix):
        name = rest[len(prefix):].lower()
        key = section + "." + name
        info = _KEYS_BY_NAME.get(key)
        if info is None:
          raise ValueError(_unknown_key_message(
              key, environ[var], has_value=True, env_var=var))
        values[key] = _parse_env(info, var, environ[var])
        break
  return values


# --------------------------------------------------------------------------
# Config objects.
# --------------------------------------------------------------------------


class _Section:
  """The keys of one section, as attributes; assignments are validated."""

  __slots__ = ("_name", "_values")

  def __init__(self, name, values):
    object.__setattr__(self, "_name", name)
    object.__setattr__(self, "_values", values)

  def __getattr__(self, attr):
    if attr.startswith("_"):
      raise AttributeError(attr)
    key = "%s.%s" % (self._name, attr)
    if key in self._values:
      return self._values[key]
    raise AttributeError(_unknown_key_message(key))

  def __setattr__(self, attr, value):
    key = "%s.%s" % (self._name, attr)
    info = _KEYS_BY_NAME.get(key)
    if info is None:
      raise ValueError(_unknown_key_message(key, value, has_value=True))
    self._values[key] = _check(info, value)

  def __delattr__(self, attr):
    raise AttributeError("EPL config keys cannot be deleted")

  def __dir__(self):
    return list(_SECTIONS[self._name])

  def to_dict(self):
    """{key: value} for this section, keys without the section prefix."""
    return {name: self._values[self._name + "." + name]
            for name in _SECTIONS[self._name]}

  def __eq__(self, other):
    if not isinstance(other, _Section):
      return NotImplemented
    return self._name == other._name and self.to_dict() == other.to_dict()

  __hash__ = None

  def __repr__(self):
    items = ", ".join("%s=%r" % kv for kv in self.to_dict().items())
    return "%s(%s)" % (self._name, items)


class Config:
  """The configuration of EPL.

  Args:
    param_dict: optional mapping of ``"section.key"`` to value (or another
      Config, which is copied). It overrides the ``EPL_<SECTION>_<KEY>``
      environment variables, which override the defaults.

  Sections are attributes (``config.pipeline.num_micro_batch``); so are
  their keys, and assigning one validates it.

  Raises:
    ValueError: an unknown key, a value of the wrong type, or an invalid
      value, in `param_dict` or in the environment.
  """

  __slots__ = ("_values", "_sections")

  def __init__(self, param_dict=None):
    self._init(param_dict, os.environ)

  def _init(self, param_dict, environ):
    if isinstance(param_dict, Config):
      param_dict = param_dict.to_dict()
    if param_dict is None:
      param_dict = {}
    if not isinstance(param_dict, Mapping):
      raise ValueError(
          "EPL Config takes a dict of \"section.key\" to value, got %r (%s)" %
          (param_dict, type(param_dict).__name__))
    values = {k.key: k.default for k in _KEYS}
    values.update(_env_values(environ))
    for key, value in param_dict.items():
      info = _KEYS_BY_NAME.get(key) if isinstance(key, str) else None
      if info is None:
        raise ValueError(_unknown_key_message(key, value, has_value=True))
      values[key] = _check(info, value)
    object.__setattr__(self, "_values", values)
    object.__setattr__(self, "_sections",
                       {s: _Section(s, values) for s in _SECTIONS})

  @classmethod
  def _from_flat(cls, flat):
    """A Config from exactly `flat`, ignoring the environment."""
    config = cls.__new__(cls)
    config._init(flat, {})
    return config

  def __getattr__(self, attr):
    if attr.startswith("_"):
      raise AttributeError(attr)
    section = self._sections.get(attr)
    if section is None:
      raise AttributeError(
          "EPL Config has no section %r; sections: %s" %
          (attr, ", ".join(_SECTIONS)))
    return section

  def __setattr__(self, attr, value):
    raise AttributeError(
        "EPL Config sections cannot be replaced; set keys instead, e.g. "
        "config.pipeline.num_micro_batch = 4")

  def __dir__(self):
    return list(_SECTIONS) + ["get", "set", "to_dict", "unbuilt_settings"]

  def get(self, key):
    """The value of ``"section.key"``; ``ValueError`` if the key is unknown."""
    if not isinstance(key, str) or key not in self._values:
      raise ValueError(_unknown_key_message(key))
    return self._values[key]

  def set(self, key, value):
    """Validates and sets ``"section.key"``."""
    info = _KEYS_BY_NAME.get(key) if isinstance(key, str) else None
    if info is None:
      raise ValueError(_unknown_key_message(key, value, has_value=True))
    self._values[key] = _check(info, value)

  def to_dict(self):
    """Flat ``{"section.key": value}`` of every key, in reference order."""
    return {k.key: self._values[k.key] for k in _KEYS}

  def unbuilt_settings(self):
    """{key: value} of keys set away from their default whose feature is
    accepted but not built yet."""
    return {k.key: self._values[k.key] for k in _KEYS
            if not k.built and self._values[k.key] != k.default}

  def __eq__(self, other):
    if not isinstance(other, Config):
      return NotImplemented
    return self._values == other._values

  __hash__ = None

  def __copy__(self):
    return Config._from_flat(self.to_dict())

  def __deepcopy__(self, memo):
    return Config._from_flat(self.to_dict())

  def __reduce__(self):
    return (_config_from_flat, (self.to_dict(),))

  def __repr__(self):
    lines = ["Config("]
    for name, section in self._sections.items():
      lines.append("  " + repr(section) + ",")
    lines.append(")")
    return "\n".join(lines)


def _config_from_flat(flat):
  return Config._from_flat(flat)


# --------------------------------------------------------------------------
# Reference table.
# --------------------------------------------------------------------------


def _md(text):
  return str(text).replace("|", "\\|")


def _default_text(value):
  if isinstance(value, str):
    return '`"%s"`' % value
  return "`%r`" % (value,)


def markdown_reference():
  """A Markdown table of every key: key, type, default, built?, meaning."""
  rows = [
      "| Key | Type | Default | Built | Meaning |",
      "| --- | --- | --- | --- | --- |",
  ]
  for k in _KEYS:
    rows.append("| `%s` | %s | %s | %s | %s |" % (
        k.key, _md(k.type_text), _md(_default_text(k.default)),
        "yes" if k.built else _NOT_BUILT, _md(k.doc)))
  return "\n".join(rows) + "\n"


if __name__ == "__main__":
  print(markdown_reference(), end="")
