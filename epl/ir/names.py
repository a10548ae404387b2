"""Every name EPL gives the ops it builds: the prefixes of copies, the scope
of each pass's own ops, and the few fixed op names.

Names are for people: TensorBoard, timelines, error messages, and the
user's op names recognisable in every copy. No decision is taken from a
name; what an op is and where it came from is in `epl.ir.provenance`.
Inside a scope, the ops are named after what they are for (the user's op or
variable they serve, `micro_batch_<m>`, `replica_<r>`), by the pass that
builds them.
"""

_REPLICA = "EPL_REPLICA_%d/"
_MICRO_BATCH = "EPL_MICRO_BATCH_%d/"
_AMP = "_EPL_AMP_"

# The scopes of the ops each pass builds, under the graph's root (a
# replica's copies of them under its prefix).
SPLIT = "EPL_SPLIT"
GRADIENT_CHECKPOINTS = "EPL_GRADIENT_CHECKPOINTS/"
GRADIENT_CHECKPOINTS_CHECK = "EPL_GRADIENT_CHECKPOINTS_CHECK/"
MICRO_BATCH_LOOP = "EPL_MICRO_BATCH_LOOP"
MICRO_BATCH_ACCUMULATION = "EPL_MICRO_BATCH_ACCUMULATION"
ZERO = "EPL_ZERO"
ZERO_WEIGHTS = "EPL_ZERO_WEIGHTS"
FED_BATCH = "EPL_FED_BATCH"
GRADIENT_AGGREGATION = "EPL_GRADIENT_AGGREGATION"
SCHEDULE = "EPL_SCHEDULE"
AMP_LOSS_SCALE = "EPL_AMP_LOSS_SCALE"
RANDOM_SEEDS = "EPL_RANDOM_SEEDS"
OFFLOAD = "EPL_OFFLOAD"
FORWARD_STATE = "EPL_FORWARD_STATE"
VARIABLE_SYNC = "EPL_VARIABLE_SYNC"
MERGED_OUTPUTS = "EPL_MERGED_OUTPUTS"
# What EPL reads of Keras' session before it opens a new one
# (`epl.runtime.keras_session`).
KERAS_SESSION_RENEWAL = "EPL_KERAS_SESSION_RENEWAL"
STEP_COUNTER = "EPL_STEP_COUNTER/"
# Ops a split layer builds while the user builds the model: its shard
# index and the random ops of a shard's initial value.
SHARD_INDEX = "EPL_SHARD_INDEX"
SHARD_RANDOM = "EPL_SHARD_RANDOM"
_HOROVOD = "EPL_HVD_%s_%d"


def horovod_op(kind, key):
  """`EPL_HVD_<kind>_<key>`: the name Horovod gets for collective `key`."""
  return _HOROVOD % (kind, key)


def replica_prefix(replica):
  """The scope of replica `replica`'s copies: `EPL_REPLICA_<replica>/`."""
  return _REPLICA % replica


def micro_batch_prefix(micro_batch):
  """The scope of micro-batch `micro_batch`'s copies:
  `EPL_MICRO_BATCH_<micro_batch>/`."""
  return _MICRO_BATCH % micro_batch


def in_replica(scope, replica, *parts):
  """`<scope>/replica_<replica>/<parts...>`: an op a pass builds for one
  replica under its own scope (ZeRO's copies, the schedule's NoOps)."""
  return "/".join(("%s/replica_%d" % (scope, replica),) + parts)


def half_precision(name, what):
  """`<name>_EPL_AMP_<what>`: mixed precision's copy of op `name` (`what`
  its dtype) or a cast made for it."""
  return name + _AMP + what
