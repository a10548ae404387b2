"""Workers that hold no replica's first stage: they serve, they do not run.

When pipeline stages span workers (2 workers x 1 device, 2 stages: one
replica, stage 0 on worker 0 and stage 1 on worker 1), the replica runs
in-graph from the worker that holds its first stage: that worker's session
places the later stages' ops on the other workers' devices, and
TensorFlow's gRPC runtime sends the stage activations (and gradients)
between them. A worker whose devices only hold later stages has nothing to
run itself. It runs the same script; when the script first runs (or
freezes) its training graph, EPL logs that this worker serves its devices,
keeps its server up while the workers that run replicas are alive, and then
ends the script with SystemExit(0) when they are gone (a failure of theirs
shows in their own exit status).
"""
import logging
import socket
import time

from epl.ir.graph_state import state_of
from epl.parallel.plan import planner

logger = logging.getLogger("epl")

_POLL_SECONDS = 0.5


def _reachable(address):
  host, _, port = address.rpartition(":")
  try:
    with socket.create_connection((host, int(port)), timeout=2):
      return True
  except OSError:
    return False


def _plan_without_local_replicas(env, graph):
  state = state_of(graph)
  if state is None or not state.gradient_records or (
      state.rewrite_result is not None):
    return None
  plan = planner.plan_of(graph)
  return None if plan is None or plan.local_replicas else plan


def maybe_serve(env, graph):
  """Serves and exits if this worker holds no replica's first stage."""
  if not env.cluster.runs_tf_server:
    return
  plan = _plan_without_local_replicas(env, graph)
  if plan is not None:
    serve_until_done(env, plan)


def serve_until_done(env, plan):
  cluster = env.cluster
  runners = sorted({plan.device_workers[r][0]
                    for r in range(plan.num_replicas)})
  addresses = [cluster.worker_addresses[w] for w in runners]
  logger.info(
      "EPL worker %d holds no replica's first stage: it serves its devices "
      "to worker(s) %s, which run the replicas in-graph, and exits when "
      "they are done.", cluster.worker_index, runners)
  timeout = env.config.cluster.collective_timeout_seconds
  deadline = time.monotonic() + timeout
  waiting = set(addresses)
  while waiting:
    waiting = {a for a in waiting if not _reachable(a)}
    if waiting and time.monotonic() > deadline:
      raise RuntimeError(
          "EPL worker %d: worker(s) at %s did not come up within "
          "cluster.collective_timeout_seconds=%g." % (
              cluster.worker_index, sorted(waiting), timeout))
    time.sleep(_POLL_SECONDS if waiting else 0)
  while any(_reachable(a) for a in addresses):
    time.sleep(_POLL_SECONDS)
  logger.info("EPL worker %d: the workers running replicas are gone; "
              "exiting.", cluster.worker_index)
  raise SystemExit(0)
