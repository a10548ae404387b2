"""The rewrite engine: from the captured single-replica graph to the
distributed one, once, before the graph first runs.

The rewrite is the passes of `PASSES`, run by the pass manager
(`epl.parallel.manager`) over the artifacts of `ARTIFACTS`: each pass
declares what it reads and writes, and runs when the plan's decisions
ask for it. `python -m epl.tools.diagram` draws them (docs/architecture.svg,
docs/architecture.md). The engine starts the rewrite with the training
step `select_training_subgraph` found (given: `captured_step`,
`subgraph`, the captured gradients, the op tags and provenance kept with
the graph's state, and the plan, made before the passes run by
`planner.plan_of`, the plan's one entry point).

Later, before each run, the passes that ran do what they declare for ops
built since and for the values fed (`Pass.on_new_ops`, `Pass.on_feed`):
the engine and the session name no pass. In a dry run
(`EPL_DRY_RUN`, `epl-plan`) the process prints the plan and exits once the
rewrite is done (`epl.hooks` calls `epl.tools.dry_run`).
"""
import collections
import dataclasses
import logging
import weakref

from epl.capture import capture
from epl.env import Env
from epl.ir import collectives
from epl.ir.graph_state import state_of, unrewritten_earlier_state
from epl.parallel.passes.resolve import resolve_training_ops
from epl.parallel.passes import grouped_apply
from epl.parallel.plan import planner
from epl.parallel.plan.decisions import (Checkpoints, LossScaling, Offload,
                                         Precision, Weights, ZeroLevel)
from epl.parallel.passes import zero
from epl.parallel.passes import zero_weights
from epl.parallel.passes.context import RewriteContext, StepGradients
from epl.parallel.passes.fed_batches import check_fed_rows, split_fed_batches
from epl.parallel.passes.forward_state import average_forward_state_updates
from epl.parallel.passes.gradient_aggregation import (aggregate_gradients,
                                               select_gradient_points)
from epl.parallel.passes.merge_outputs import merge_global_objects
from epl.parallel.passes.micro_batches import clone_micro_batches
from epl.parallel.passes.offload import offload_variables
from epl.parallel.passes.replicas import (clone_replicas, join_replicas,
                                   order_input_reads, place_replica_zero)
from epl.parallel.passes.random_seeds import vary_random_seeds
from epl.parallel.passes.schedule import schedule_pipeline
from epl.parallel.passes.shared_weights import share_weights
from epl.parallel.passes.shared_writes import (order_reference_updates,
                                      order_shared_writes)
from epl.parallel.passes.split import lower_split, update_checkpoints
from epl.parallel.passes.stage_checks import check_stages
from epl.parallel.passes.training_subgraph import select_training_subgraph
from epl.parallel.passes.variable_sync import sync_new_writes, sync_variables
from epl.parallel.manager import Artifact, Pass, PassManager
from epl.parallel.passes.amp import convert_to_half
from epl.parallel.passes.gradient_checkpoint import recompute_activations
from epl.parallel.passes.loss_scale import scale_loss, skip_nonfinite_updates

logger = logging.getLogger("epl")
# GraphState -> the graph version at which gradients were found without
# updates (looked at again once the graph grows).
_VERSION_WITHOUT_STEP = weakref.WeakKeyDictionary()

ARTIFACTS = (
    Artifact("captured_step", "CapturedStep",
             "The training step as captured and selected: gradient and "
             "apply records, loss seeds, updates, joins, shared ops and "
             "writes, input reads. Never changed."),
    Artifact("subgraph", "TrainingSubgraph",
             "The per-replica part of the step: the ops every replica "
             "copies (topologically ordered) and its replicated variables."),
    Artifact("tags", "GraphState",
             "TaskGraph, phase and micro-batch of every op.",
             in_context=True),
    Artifact("provenance", "Provenance",
             "Pass, source, replica and micro-batch of every op EPL built "
             "(the manager records the pass; passes that copy ops record "
             "the copies); roles of split lowering ops.",
             in_context=True),
    Artifact("plan", "Plan",
             "Replicas, their devices, micro-batches, schedule and every "
             "decision the passes apply (planner.plan_of, made before the "
             "passes run).", in_context=True),
    Artifact("gradients", "StepGradients",
             "The recorded gradients as the graph now computes them."),
    Artifact("gradient_points", "[[(gradient, variable)]]",
             "Per tf.gradients call, the pairs the replicas all-reduce."),
    Artifact("copies", "Copies",
             "Each op's copy by local replica and micro-batch."),
    Artifact("user_devices", "{op name: device}",
             "The device the user set on each op of the step, and on "
             "replica 0's copies of it."),
    Artifact("micro_batching", "Decision",
             "How the micro-batches run (loop or copies) and why: the "
             "plan's decision, or copies where the step has an op the loop "
             "cannot hold."),
    Artifact("zero_partition", "zero.Partition or None",
             "The owner replica of each trained variable, and its update."),
    Artifact("loss_scale_state", "loss scale variables or None",
             "The dynamic loss scale and its count of good steps."),
    Artifact("recomputed_segments", "[[op]]",
             "Replica 0's recomputed ops, one list per segment."),
    Artifact("split_variables", "{variable name: ShardedVariable}",
             "The split variables lower_split sharded (and initialised per "
             "shard), for the Savers built after it."),
    Artifact("fed_batch_parts", "{tensor name: (parts, replicas, "
             "micro-batches)}",
             "Each placeholder's batch split over the copies of the step."),
    Artifact("substitutes", "{name: tensor or op}",
             "What a Session.run fetches instead of a tensor or op."),
    Artifact("variable_sync", "VariableSync",
             "Copies replica 0's variable writes into the other replicas, "
             "now and before later runs."),
)
# What the rewrite starts with.
GIVEN = ("captured_step", "subgraph", "gradients", "tags", "provenance",
         "plan")


# When passes run: each reads the context's plan (its decisions) or a
# setting the plan passes through.


def _grouped_apply(ctx):
  """optimizer.num_apply_group > 1"""
  return ctx.config.optimizer.num_apply_group > 1


def _amp(ctx):
  """amp.level O1"""
  return ctx.plan.decisions.precision.value is not Precision.FULL


def _loss_scale(ctx):
  """amp.level O1 with amp.dtype float16"""
  return ctx.plan.decisions.loss_scaling.value is not LossScaling.NONE


def _dynamic_loss_scale(ctx):
  """amp.level O1, amp.dtype float16, amp.loss_scale dynamic"""
  return ctx.plan.decisions.loss_scaling.value is LossScaling.DYNAMIC


def _gradient_checkpoint(ctx):
  """gradient_checkpoint.type set"""
  return ctx.plan.decisions.checkpoints.value is not Checkpoints.NONE


def _zero(ctx):
  """zero.level set"""
  return ctx.plan.decisions.zero.value is not ZeroLevel.NONE


def _zero_v3(ctx):
  """zero.level v3"""
  return ctx.plan.decisions.zero.value.partitions_weights


def _shared_weights(ctx):
  """communication.shared_weights with local sums (plan: Weights.SHARED)"""
  return ctx.plan.decisions.weights.value is Weights.SHARED


def _offload(ctx):
  """offload.level v0"""
  return ctx.plan.decisions.offload.value is Offload.HOST


PASSES = (
    Pass("resolve_training_ops", resolve_training_ops,
         reads=("subgraph", "tags"), writes=("tags",)),
    Pass("check_stages", check_stages,
         reads=("captured_step", "subgraph", "tags")),
    Pass("select_gradient_points", select_gradient_points,
         reads=("captured_step", "tags"), writes=("gradient_points",)),
    Pass("check_grouped", grouped_apply.check_grouped,
         reads=("captured_step",), enabled=_grouped_apply),
    Pass("place_replica_zero", place_replica_zero,
         reads=("subgraph", "tags", "plan"),
         writes=("copies", "user_devices")),
    Pass("convert_to_half", convert_to_half,
         reads=("subgraph", "tags", "gradients", "gradient_points", "copies",
                "user_devices"),
         writes=("subgraph", "tags", "provenance", "gradients",
                 "gradient_points", "copies", "user_devices"),
         enabled=_amp),
    Pass("scale_loss", scale_loss,
         reads=("captured_step", "subgraph", "tags", "plan", "gradients",
                "gradient_points", "copies"),
         writes=("subgraph", "tags", "gradients", "gradient_points",
                 "copies", "loss_scale_state"),
         enabled=_loss_scale),
    Pass("recompute_activations", recompute_activations,
         reads=("captured_step", "subgraph", "tags", "gradients", "copies",
                "user_devices"),
         writes=("subgraph", "tags", "provenance", "copies", "user_devices",
                 "recomputed_segments"),
         enabled=_gradient_checkpoint),
    Pass("clone_micro_batches", clone_micro_batches,
         reads=("subgraph", "tags", "plan", "gradients", "gradient_points",
                "copies", "user_devices"),
         writes=("subgraph", "tags", "provenance", "gradient_points",
                 "copies", "user_devices", "micro_batching")),
    Pass("partition_updates", zero.partition_updates,
         reads=("subgraph", "tags", "plan", "gradients", "gradient_points",
                "copies"),
         writes=("subgraph", "zero_partition"), enabled=_zero),
    Pass("share_weights", share_weights,
         reads=("subgraph", "tags", "plan", "gradient_points"),
         writes=("subgraph",), enabled=_shared_weights),
    Pass("clone_replicas", clone_replicas,
         reads=("subgraph", "tags", "plan", "copies", "user_devices"),
         writes=("tags", "provenance", "copies")),
    # Right after the copies exist: the passes that build from a copy's
    # inputs (zero.level v3's gradient shards, from each replica's
    # activations) must read its part of a fed batch, not the whole.
    Pass("split_fed_batches", split_fed_batches,
         reads=("captured_step", "subgraph", "tags", "plan", "copies"),
         writes=("fed_batch_parts",), on_feed=check_fed_rows),
    Pass("vary_random_seeds", vary_random_seeds,
         reads=("subgraph", "tags", "plan", "copies")),
    Pass("place_updates", zero.place_updates,
         reads=("zero_partition", "captured_step", "subgraph", "tags", "plan",
                "gradient_points", "copies"),
         writes=("gradient_points", "copies"), enabled=_zero),
    Pass("partition_weights", zero_weights.partition_weights,
         reads=("zero_partition", "subgraph", "tags", "plan",
                "gradient_points", "copies"),
         writes=("subgraph", "gradient_points"), enabled=_zero_v3),
    Pass("offload_variables", offload_variables,
         reads=("tags", "plan", "copies"), enabled=_offload),
    Pass("order_input_reads", order_input_reads,
         reads=("captured_step", "plan", "copies")),
    Pass("lower_split", lower_split,
         reads=("subgraph", "tags", "provenance", "plan", "gradient_points",
                "copies"),
         writes=("subgraph", "provenance", "gradient_points",
                 "split_variables"),
         on_new_ops=update_checkpoints),
    Pass("join_replicas", join_replicas,
         reads=("captured_step", "subgraph", "plan", "copies")),
    Pass("order_shared_writes", order_shared_writes,
         reads=("captured_step", "subgraph", "plan", "copies")),
    Pass("order_reference_updates", order_reference_updates,
         reads=("captured_step", "subgraph", "plan", "copies")),
    Pass("average_forward_state_updates", average_forward_state_updates,
         reads=("captured_step", "subgraph", "tags", "plan", "copies"),
         writes=("tags",)),
    Pass("aggregate_gradients", aggregate_gradients,
         reads=("tags", "plan", "gradient_points", "copies")),
    Pass("skip_nonfinite_updates", skip_nonfinite_updates,
         reads=("loss_scale_state", "captured_step", "subgraph", "tags",
                "plan", "copies"),
         enabled=_dynamic_loss_scale),
    Pass("schedule_pipeline", schedule_pipeline,
         reads=("subgraph", "tags", "plan", "copies")),
    Pass("merge_global_objects", merge_global_objects,
         reads=("tags", "plan", "copies"), writes=("substitutes",)),
    Pass("sync_variables", sync_variables,
         reads=("captured_step", "subgraph", "tags", "provenance", "plan",
                "copies", "substitutes"),
         writes=("variable_sync", "substitutes"), on_new_ops=sync_new_writes),
    Pass("translate_whole_values", zero_weights.translate_whole_values,
         reads=("zero_partition", "copies", "substitutes"),
         writes=("substitutes",), enabled=_zero_v3,
         on_new_ops=zero_weights.update_after_rewrite,
         on_feed=zero_weights.check_feeds),
)


def pass_manager():
  """The PassManager of the rewrite, its passes registered."""
  manager = PassManager(ARTIFACTS, given=GIVEN)
  for pass_ in PASSES:
    manager.register(pass_)
  return manager


class RewriteResult:
  """What the rewrite left for the runtime and for inspection: its
  context, its pass manager and the final value of every artifact."""

  def __init__(self, ctx, manager, artifacts):
    self.context = ctx
    self.manager = manager
    self.artifacts = artifacts
    self.plan = ctx.plan
    self.step = artifacts["captured_step"]
    self.subgraph = artifacts["subgraph"]
    self.copies = artifacts["copies"]
    self.gradient_points = artifacts["gradient_points"]
    self.recomputed_segments = artifacts.get("recomputed_segments", [])
    self.zero_partition = artifacts.get("zero_partition")
    # How the micro-batches finally run, and why (the plan's decision, or
    # copies where the step has an op the loop cannot hold).
    self.micro_batching = artifacts["micro_batching"]
    self.substitutes = artifacts["substitutes"]
    self.variable_sync = artifacts["variable_sync"]
    self.graph_version = ctx.graph.version
    # Names of every op of the rewritten step (epl.runtime.coverage).
    self.covered_names = None

  @property
  def decisions(self):
    """The plan's decisions as the rewrite applied them: the micro-batches
    as they finally run (copies where the step has an op the loop cannot
    hold, though the plan decided a loop)."""
    return dataclasses.replace(self.plan.decisions,
                               micro_batches=self.micro_batching)


def _log_plan(result):
  ctx, subgraph = result.context, result.subgraph
  phases = collections.Counter(
      ctx.state.phase_of(op).value for op in subgraph.cloned)
  logger.info("EPL plan: %s", result.plan.describe())
  for line in result.decisions.lines(notable_only=True):
    logger.info("EPL plan: %s", line)
  logger.info(
      "EPL rewrite: %d local replica(s) %s; per replica %d ops cloned (%s), "
      "%d shared, %d variables replicated", len(ctx.replicas), ctx.replicas,
      len(subgraph.cloned),
      ", ".join("%s %d" % kv for kv in sorted(phases.items())),
      len(result.step.shared), len(subgraph.variables))


def run_passes(graph, state, step, subgraph, until=None):
  """Runs the rewrite passes (up to pass `until`, when given) over `graph`,
  whose training step is `step` with per-replica part `subgraph`; returns
  (context, manager, {artifact: value})."""
  env = Env.get()
  ctx = RewriteContext(graph, state, env.config, env.cluster,
                       planner.plan_of(graph, for_rewrite=True))
  manager = pass_manager()
  with capture.suspended():
    artifacts = manager.run(ctx, {
        "captured_step": step, "subgraph": subgraph,
        "gradients": StepGradients.captured(step)}, until=until)
  return ctx, manager, artifacts


def rewrite(graph, state, step, subgraph):
  """Runs the rewrite passes over `graph`, whose training step is `step`
  with per-replica part `subgraph`; returns the RewriteResult."""
  result = RewriteResult(*run_passes(graph, state, step, subgraph))
  _log_plan(result)
  if not result.context.cluster.is_distributed:
    # Every member of every collective is in this graph: prove each group
    # whole now rather than let a run wait for a member that never comes.
    collectives.check_whole_groups(graph)
  return result


def _refuse_unrewritten_earlier_step(graph):
  """Raises, naming the fix, for a training step built under an earlier
  epl.init and first run after a later one: its config is gone, and
  running it unrewritten would silently train on one device."""
  if unrewritten_earlier_state(graph) is None:
    return
  raise RuntimeError(
      "EPL: this graph's training step was built under an earlier epl.init "
      "and was never run (nor rewritten: epl.parallel.engine."
      "ensure_rewritten) before a later epl.init replaced its config, so EPL "
      "can no longer parallelise it as configured. Run (or rewrite) each "
      "graph before the next epl.init, or call epl.init once per process "
      "(one process per config).")


def ensure_rewritten(graph):
  """Rewrites `graph` once, when it holds a training step under strategies:
  gradients recorded and variable updates built from them."""
  state = state_of(graph)
  if state is None:
    _refuse_unrewritten_earlier_step(graph)
    return None
  if not state.taskgraphs or not state.gradient_records:
    return None
  if state.rewrite_result is None and _VERSION_WITHOUT_STEP.get(state) != (
      graph.version):
    step, subgraph = select_training_subgraph(graph, state)
    if not step.updates:
      # Gradients without updates (yet): look again when the graph grows.
      _VERSION_WITHOUT_STEP[state] = graph.version
      return None
    state.rewrite_result = rewrite(graph, state, step, subgraph)
  return state.rewrite_result


def before_run(graph, feed_dict=None):
  """Called before every Session.run: rewrites the graph once, lets the
  passes that ran handle the ops built since (`Pass.on_new_ops`) and check
  `feed_dict` (`Pass.on_feed`); returns the fetch substitutes."""
  result = ensure_rewritten(graph)
  if result is None:
    return None
  ctx = result.context
  if graph.version != result.graph_version and not graph.finalized:
    with capture.suspended():
      result.manager.run_later("on_new_ops", ctx, result.artifacts)
    result.graph_version = graph.version
  if feed_dict:
    result.manager.run_later("on_feed", ctx, result.artifacts, feed_dict)
  return result.substitutes
