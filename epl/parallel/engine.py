"""The rewrite engine: from the captured single-replica graph to the
distributed one, once, before the graph first runs.

The rewrite is the passes of `PASSES`, run by the pass manager
(`epl.parallel.manager`) over the artifacts of `ARTIFACTS`: each pass
declares what it reads and writes, and runs when its configuration asks
for it. `python -m epl.tools.diagram` draws them (docs/architecture.svg,
docs/architecture.md). The engine starts the rewrite with the training
step `select_training_subgraph` found (given: `captured_step`,
`subgraph`, the captured gradients, and the op tags and provenance kept
with the graph's state).

Later, before each run, VariableSync handles ops built since. In a dry run
(`EPL_DRY_RUN`, `epl-plan`) the process prints the plan and exits once the
rewrite is done (`epl.hooks` calls `epl.tools.dry_run`).
"""
import collections
import logging

from epl.capture import capture
from epl.env import Env
from epl.ir import collectives
from epl.ir.graph_state import state_of
from epl.parallel.passes.resolve import resolve_training_ops
from epl.parallel.passes import grouped_apply
from epl.parallel.plan import planner
from epl.parallel.passes import zero
from epl.parallel.passes import zero_weights
from epl.parallel.passes.context import RewriteContext, StepGradients
from epl.parallel.passes.fed_batches import split_fed_batches
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
from epl.parallel.passes.shared_writes import (order_reference_updates,
                                      order_shared_writes)
from epl.parallel.passes.split import lower_split, update_checkpoints
from epl.parallel.passes.stage_checks import check_stages
from epl.parallel.passes.training_subgraph import select_training_subgraph
from epl.parallel.passes.variable_sync import sync_variables
from epl.parallel.manager import Artifact, Pass, PassManager
from epl.parallel.passes import amp
from epl.parallel.passes import loss_scale
from epl.parallel.passes.amp import convert_to_half
from epl.parallel.passes.gradient_checkpoint import recompute_activations
from epl.parallel.passes.loss_scale import scale_loss, skip_nonfinite_updates

logger = logging.getLogger("epl")

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
             in_graph_state=True),
    Artifact("provenance", "Provenance",
             "Pass, source, replica and micro-batch of every op EPL built "
             "(the manager records the pass; passes that copy ops record "
             "the copies); roles of split lowering ops.",
             in_graph_state=True),
    Artifact("plan", "Plan",
             "Replicas, their devices, micro-batches and schedule "
             "(planner.plan_of).", in_graph_state=True),
    Artifact("gradients", "StepGradients",
             "The recorded gradients as the graph now computes them."),
    Artifact("gradient_points", "[[(gradient, variable)]]",
             "Per tf.gradients call, the pairs the replicas all-reduce."),
    Artifact("copies", "Copies",
             "Each op's copy by local replica and micro-batch."),
    Artifact("user_devices", "{op name: device}",
             "The device the user set on each op of the step, and on "
             "replica 0's copies of it."),
    Artifact("zero_partition", "zero.Partition or None",
             "The owner replica of each trained variable, and its update."),
    Artifact("loss_scale_state", "loss scale variables or None",
             "The dynamic loss scale and its count of good steps."),
    Artifact("recomputed_segments", "[[op]]",
             "Replica 0's recomputed ops, one list per segment."),
    Artifact("substitutes", "{name: tensor or op}",
             "What a Session.run fetches instead of a tensor or op."),
    Artifact("variable_sync", "VariableSync",
             "Copies replica 0's variable writes into the other replicas, "
             "now and before later runs."),
)
# What the rewrite starts with.
GIVEN = ("captured_step", "subgraph", "gradients", "tags", "provenance")


def make_plan(ctx):
  """Lays the TaskGraphs out on the cluster: replicas, devices,
  micro-batches and schedule (planner.plan_of); changes no op."""
  planner.plan_of(ctx.graph, for_rewrite=True)


def _grouped_apply(config):
  """optimizer.num_apply_group > 1"""
  return config.optimizer.num_apply_group > 1


def _amp(config):
  """amp.level O1"""
  return amp.enabled(config)


def _loss_scale(config):
  """amp.level O1 with amp.dtype float16"""
  return loss_scale.used(config)


def _dynamic_loss_scale(config):
  """amp.level O1, amp.dtype float16, amp.loss_scale dynamic"""
  return loss_scale.used(config) and loss_scale.dynamic(config)


def _gradient_checkpoint(config):
  """gradient_checkpoint.type set"""
  return bool(config.gradient_checkpoint.type)


def _zero(config):
  """zero.level set"""
  return bool(config.zero.level)


def _zero_v3(config):
  """zero.level v3"""
  return config.zero.level == "v3"


def _offload(config):
  """offload.level v0"""
  return config.offload.level == "v0"


PASSES = (
    Pass("resolve_training_ops", resolve_training_ops,
         reads=("subgraph", "tags"), writes=("tags",)),
    Pass("check_stages", check_stages,
         reads=("captured_step", "subgraph", "tags")),
    Pass("make_plan", make_plan, writes=("plan",)),
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
                 "copies", "user_devices")),
    Pass("partition_updates", zero.partition_updates,
         reads=("subgraph", "tags", "plan", "gradients", "gradient_points",
                "copies"),
         writes=("subgraph", "zero_partition"), enabled=_zero),
    Pass("clone_replicas", clone_replicas,
         reads=("subgraph", "tags", "plan", "copies", "user_devices"),
         writes=("tags", "provenance", "copies")),
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
         writes=("subgraph", "provenance", "gradient_points")),
    Pass("split_fed_batches", split_fed_batches,
         reads=("captured_step", "subgraph", "tags", "plan", "copies")),
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
         writes=("variable_sync", "substitutes")),
    Pass("translate_whole_values", zero_weights.translate_whole_values,
         reads=("copies", "substitutes"), writes=("substitutes",),
         enabled=_zero_v3),
)


def pass_manager():
  """The PassManager of the rewrite, its passes registered."""
  manager = PassManager(ARTIFACTS, given=GIVEN)
  for pass_ in PASSES:
    manager.register(pass_)
  return manager


class RewriteResult:
  """What the rewrite left for the runtime and for inspection: its
  context and the final value of every artifact."""

  def __init__(self, ctx, artifacts):
    self.context = ctx
    self.plan = ctx.plan
    self.step = artifacts["captured_step"]
    self.subgraph = artifacts["subgraph"]
    self.copies = artifacts["copies"]
    self.gradient_points = artifacts["gradient_points"]
    self.recomputed_segments = artifacts.get("recomputed_segments", [])
    self.zero_partition = artifacts.get("zero_partition")
    self.substitutes = artifacts["substitutes"]
    self.variable_sync = artifacts["variable_sync"]
    self.graph_version = ctx.graph.version
    # Names of every op of the rewritten step (epl.runtime.coverage).
    self.covered_names = None


def _log_plan(result):
  ctx, subgraph = result.context, result.subgraph
  phases = collections.Counter(
      ctx.state.phase_of(op).value for op in subgraph.cloned)
  logger.info("EPL plan: %s", result.plan.describe())
  logger.info(
      "EPL rewrite: %d local replica(s) %s; per replica %d ops cloned (%s), "
      "%d shared, %d variables replicated", len(ctx.replicas), ctx.replicas,
      len(subgraph.cloned),
      ", ".join("%s %d" % kv for kv in sorted(phases.items())),
      len(result.step.shared), len(subgraph.variables))


def rewrite(graph, state, step, subgraph):
  """Runs the rewrite passes over `graph`, whose training step is `step`
  with per-replica part `subgraph`; returns the RewriteResult."""
  env = Env.get()
  ctx = RewriteContext(graph, state, env.config, env.cluster)
  with capture.suspended():
    artifacts = pass_manager().run(ctx, {
        "captured_step": step, "subgraph": subgraph,
        "gradients": StepGradients.captured(step)})
  result = RewriteResult(ctx, artifacts)
  _log_plan(result)
  if not ctx.cluster.is_distributed:
    # Every member of every collective is in this graph: prove each group
    # whole now rather than let a run wait for a member that never comes.
    collectives.check_whole_groups(graph)
  return result


def ensure_rewritten(graph):
  """Rewrites `graph` once, when it holds a training step under strategies:
  gradients recorded and variable updates built from them."""
  state = state_of(graph)
  if state is None or not state.taskgraphs or not state.gradient_records:
    return None
  if state.rewrite_result is None and state.version_without_step != (
      graph.version):
    step, subgraph = select_training_subgraph(graph, state)
    if not step.updates:
      # Gradients without updates (yet): look again when the graph grows.
      state.version_without_step = graph.version
      return None
    state.rewrite_result = rewrite(graph, state, step, subgraph)
  return state.rewrite_result


def before_run(graph):
  """Called before every Session.run: returns the fetch substitutes."""
  result = ensure_rewritten(graph)
  if result is None:
    return None
  if graph.version != result.graph_version and not graph.finalized:
    ctx = result.context
    with capture.suspended(), ctx.state.provenance.building(
        "sync_variables", graph):
      result.variable_sync.update()
      update_checkpoints(ctx, result.copies)
      zero_weights.update_after_rewrite(ctx, result.copies,
                                        result.substitutes)
    result.graph_version = graph.version
  return result.substitutes
