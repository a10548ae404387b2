"""What every session the user opens gets from EPL.

Users keep their own `tf.compat.v1.Session` / `MonitoredTrainingSession`
code. EPL adds the devices (logical CPU devices on machines without GPUs),
soft placement, the Grappler preset of `optimizer.grappler` (where the
user's own session config leaves Grappler's settings alone), and, before
each run, the rewrite, a check that fed batches divide over the replicas,
and the swap of fetched tensors for their values merged over replicas.

In a multi-worker job the session also gets this worker's server as its
target, the collective group leader, and device filters that keep it to the
workers its replicas use (its own, plus the workers that hold later pipeline
stages of its replicas): ops that EPL does not place stay on this worker,
and a dead peer outside them cannot stall the session's creation.
"""
import tensorflow as tf

from epl.capture import io_slicing
from epl.ir import control_flow
from epl.ir.graph_state import state_of
from epl.parallel import engine
from epl.runtime import collective_groups
from epl.runtime import coverage
from epl.runtime import cpu_threads
from epl.runtime import grappler
from epl.runtime import server as epl_server


def _distributed_settings(env, target, graph, merged):
  server = epl_server.get_or_start(env)
  if target and target != server.target:
    raise ValueError(
        "EPL runs this worker's tf.distribute.Server (%s) itself, from "
        "TF_CONFIG; open the session without a target (got %r) and remove "
        "your own server." % (server.target, target))
  merged.experimental.collective_group_leader = epl_server.GROUP_LEADER
  del merged.device_filters[:]
  workers = epl_server.session_workers(env, graph)
  for worker in workers:
    merged.device_filters.append(epl_server.task_filter(worker))
  if len(workers) > 1 and not merged.operation_timeout_in_ms:
    # Stages on other workers run in-graph: a step waits on their RunGraph
    # calls, which no collective timeout covers.
    merged.operation_timeout_in_ms = int(
        env.config.cluster.collective_timeout_seconds * 1000)
  return server.target


def session_settings(env, target, config, graph=None):
  """(target, ConfigProto) for a new session: the user's plus EPL's needs."""
  merged = tf.compat.v1.ConfigProto()
  if config is not None:
    merged.CopyFrom(config)
  cluster = env.cluster
  if cluster.runs_tf_server:
    target = _distributed_settings(
        env, target, graph or tf.compat.v1.get_default_graph(), merged)
  if cluster.device_type == "CPU":
    current = merged.device_count.get("CPU", 0)
    merged.device_count["CPU"] = max(current, cluster.devices_per_worker)
    cpu_threads.set_threads(env.cpu_threads, merged)
  elif (env.config.cluster.run_visible_devices and
        not merged.gpu_options.visible_device_list):
    merged.gpu_options.visible_device_list = (
        env.config.cluster.run_visible_devices)
  # EPL pins ops to devices; kernels without an implementation on that
  # device (tf.data, strings) must still fall back to the host.
  merged.allow_soft_placement = True
  grappler.apply_preset(env.config.optimizer.grappler,
                        merged.graph_options.rewrite_options)
  return target, merged


def _substitute(fetch, substitutes, graph):
  """`fetch` with merged tensors swapped in, keeping its structure.

  Session.run accepts nested lists, tuples, namedtuples and dicts (whose
  keys may be any object, e.g. MonitoredSession's hooks), so this walks
  them itself rather than with tf.nest, which sorts dict keys. Other
  objects that stand for a tensor (a variable) are looked up by the tensor
  they stand for (`Graph.as_graph_element`), and kept when none is
  substituted.
  """
  if isinstance(fetch, (tf.Tensor, tf.Operation, str)):
    name = fetch if isinstance(fetch, str) else fetch.name
    return substitutes.get(name, fetch)
  if isinstance(fetch, dict):
    return type(fetch)((k, _substitute(v, substitutes, graph))
                       for k, v in fetch.items())
  if isinstance(fetch, list):
    return [_substitute(f, substitutes, graph) for f in fetch]
  if isinstance(fetch, tuple):
    items = [_substitute(f, substitutes, graph) for f in fetch]
    return type(fetch)(*items) if hasattr(fetch, "_fields") else tuple(items)
  if isinstance(fetch, tf.Variable):
    element = graph.as_graph_element(fetch)
    return substitutes.get(element.name, fetch)
  return fetch


def before_run(graph, fetches, feed_dict=None):
  """Rewrites the graph if needed and checks the fed batches; returns the
  fetches to really run and the ops to run beside them (the members of
  the collective groups the fetches reach, `collective_groups`)."""
  substitutes = engine.before_run(graph, feed_dict)
  io_slicing.check_rewritten(graph)
  state = state_of(graph)
  coverage.check_run(graph, fetches)
  if substitutes:
    fetches = _substitute(fetches, substitutes, graph)
  if state is None or state.rewrite_result is None:
    return fetches, []
  fetched = []
  coverage.fetched_ops(fetches, graph, fetched)
  _check_not_in_micro_batch_loop(fetched, state)
  # The cluster the graph was rewritten for, which a later epl.init does
  # not change.
  one_worker = not state.rewrite_result.context.cluster.is_distributed
  return fetches, collective_groups.extra_targets(graph, fetched,
                                                  one_worker)


def _check_not_in_micro_batch_loop(fetched, state):
  """Raises, naming the fix, for a fetch that runs in the micro-batch loop
  (TensorFlow would only say it is "not fetchable")."""
  for op in fetched:
    if control_flow.in_rewritten_loop(op, state.provenance):
      raise ValueError(
          "EPL: %r is computed once per micro-batch inside the micro-batch "
          "loop (pipeline.accumulation \"loop\"), so a Session.run cannot "
          "fetch it. Put it in a merged collection before the first "
          "Session.run (epl.add_to_collection(tensor, "
          "epl.GraphKeys.GLOBAL_MEAN_OBJECTS), or GLOBAL_CONCAT_OBJECTS for "
          "every row) to get its value over all micro-batches, or set "
          "pipeline.accumulation to \"copies\"." % op.name)
