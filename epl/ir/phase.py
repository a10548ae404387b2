"""The phase of an op in the training step."""
import enum


class Phase(enum.Enum):
  """Where an op sits in one training step.

  FORWARD ops are built by the user's model code under a strategy scope;
  BACKWARD ops by `tf.gradients` (and any gradient post-processing such as
  clipping); APPLY ops by `Optimizer.apply_gradients`; OTHER ops are
  everything outside the training step (initializers, save/restore,
  summaries, ops built outside every strategy scope).
  """
  FORWARD = "forward"
  BACKWARD = "backward"
  APPLY = "apply"
  OTHER = "other"


class ModelPhase:
  """The original EPL's phase names (`epl.ir.phase.ModelPhase`), as
  `epl.Operation.phase` reports them.

  EPL tags phases itself (`tf.gradients`, `apply_gradients`); the
  original's `with ModelPhase(...)` scope, which set the phase of the ops
  built inside, is not part of EPL. OTHER is EPL's name for the ops
  outside the training step (initializers, save/restore, summaries).
  """
  ADD_FUNCTION = "ADD_FUNCTION_PHASE"
  APPLY = "MODEL_APPLY_PHASE"
  BACKWARD = "MODEL_BACKWARD_PHASE"
  FORWARD = "MODEL_FORWARD_PHASE"
  FORWARD_AND_BACKWARD_AND_APPLY = "FORWARD_AND_BACKWARD_AND_APPLY_PHASE"
  MICRO_BATCH_CLONE = "MICRO_BATCH_CLONE_PHASE"
  REPLICATED = "REPLICATED_PHASE"
  SAVE_AND_RESTORE = "SAVE_AND_RESTORE_PHASE"
  SESSION_RUN_PHASE = "SESSION_RUN_PHASE"
  OTHER = "OTHER_PHASE"

  def __init__(self, phase):
    raise NotImplementedError(
        "epl.ir.phase.ModelPhase(%r) as a scope is not built: EPL tags each "
        "op's phase itself (ops built by tf.gradients are BACKWARD, by "
        "apply_gradients APPLY). Read phases with epl.Operation.phase." %
        (phase,))
