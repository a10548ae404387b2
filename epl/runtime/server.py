"""This worker's `tf.distribute.Server` in a multi-worker job.

Every worker of a `TF_CONFIG` job runs one gRPC server. EPL starts it in
`epl.init` (not lazily at the first session) so that it listens as early as
possible: peers that reach their first collective find it up, and its
devices (G logical CPU devices, or the visible GPUs) exist before any session
is made. TensorFlow cannot stop a server, so a process keeps the first one;
a later `epl.init` with the same cluster reuses it and one with another
cluster is an error.

All workers form one job, `worker`, in TF_CONFIG order with the chief (if
any) first, so the device `/job:worker/replica:0/task:k` is worker k and
task 0 leads the collective groups.

A TF2 script (eager execution on at `epl.init`) runs its steps as
`tf.function`s in the eager context, whose collectives across processes
need the context itself to serve the worker (`epl.tf_compat.eager_cluster`):
there the eager context's own server takes the worker's address instead
of a `tf.distribute.Server`, and a Session of the job (an Estimator's)
targets it.
"""
import logging

import tensorflow as tf

from epl.parallel.plan import planner
from epl.runtime import cpu_threads
from epl.runtime import network_namespace
from epl.tf_compat import eager_cluster

logger = logging.getLogger("epl")

JOB = "worker"
GROUP_LEADER = "/job:worker/replica:0/task:0"

# "server": the tf.distribute.Server, or EAGER when the eager context
# serves this worker.
_server = {"server": None, "key": None}
EAGER = "the eager context"


def task_filter(worker):
  """The device filter that names worker `worker`'s devices."""
  return "/job:%s/task:%d" % (JOB, worker)


def base_config(cluster, config, threads):
  """The ConfigProto that the server and every session share; `threads`:
  the ThreadPlan of its CPU devices."""
  proto = tf.compat.v1.ConfigProto()
  if cluster.device_type == "CPU":
    proto.device_count["CPU"] = cluster.devices_per_worker
    cpu_threads.set_threads(threads, proto)
  elif config.cluster.run_visible_devices:
    proto.gpu_options.visible_device_list = config.cluster.run_visible_devices
  proto.experimental.collective_group_leader = GROUP_LEADER
  proto.allow_soft_placement = True
  return proto


def _key(cluster):
  return (tuple(cluster.worker_addresses), cluster.worker_index,
          cluster.device_type, cluster.devices_per_worker)


def _reuse(cluster):
  """The server this process already runs for `cluster`, or None when it
  runs none; raises when it serves another cluster."""
  if _server["server"] is None:
    return None
  if _server["key"] != _key(cluster):
    raise RuntimeError(
        "This process already runs the EPL server of worker %d of %s; "
        "TensorFlow cannot stop it, so epl.init cannot move this process "
        "to worker %d of %s. Start a new process for another cluster." % (
            _server["key"][1], list(_server["key"][0]),
            cluster.worker_index, cluster.worker_addresses))
  return _server["server"]


def start(env):
  """Starts this worker's server at epl.init: the eager context's when
  execution is eager (a TF2 script), else a tf.distribute.Server; None
  for one worker."""
  cluster = env.cluster
  if not cluster.runs_tf_server:
    return None
  if tf.executing_eagerly():
    return _serve_eagerly(env)
  return get_or_start(env)


def _serve_eagerly(env):
  cluster = env.cluster
  if _reuse(cluster) is not None:
    return _server["server"]
  if eager_cluster.started():
    raise RuntimeError(
        "epl.init() joins worker %d of a %d-worker job through TensorFlow's "
        "eager runtime, which must be started with the cluster, but it "
        "already started (an op or a tf.data pipeline ran before "
        "epl.init()). Call epl.init() at the top of the script, before "
        "anything runs." % (cluster.worker_index, cluster.worker_num))
  spec = tf.train.ClusterSpec({JOB: cluster.worker_addresses})
  devices = eager_cluster.serve(spec, JOB, cluster.worker_index,
                                GROUP_LEADER, task_filter(cluster.worker_index))
  _server.update(server=EAGER, key=_key(cluster))
  _say_what_the_job_exposes(cluster)
  logger.info("epl.init: worker %d of %d serves at %s through the eager "
              "context (a TF2 script: tf.function steps), devices %s",
              cluster.worker_index, cluster.worker_num,
              cluster.worker_addresses[cluster.worker_index],
              ", ".join(devices))
  return EAGER


class _EagerServer:
  """The eager context's gRPC server as a Session's target: a full
  TensorFlow server (master and worker services), so a graph built
  under eager execution (an Estimator's, a `tf.Graph().as_default()`
  block) runs in a Session of the same job."""

  def __init__(self, target):
    self.target = target


def get_or_start(env):
  """This worker's server for a Session, started on first use: its
  tf.distribute.Server, or the eager context's when that serves the
  worker; None for one worker."""
  cluster = env.cluster
  if not cluster.runs_tf_server:
    return None
  server = _reuse(cluster)
  if server is EAGER:
    return _EagerServer("grpc://" + cluster.worker_addresses[
        cluster.worker_index])
  if server is not None:
    return server
  spec = tf.train.ClusterSpec({JOB: cluster.worker_addresses})
  server = tf.distribute.Server(
      spec, job_name=JOB, task_index=cluster.worker_index,
      config=base_config(cluster, env.config, env.cpu_threads),
      protocol="grpc", start=True)
  _server.update(server=server, key=_key(cluster))
  _say_what_the_job_exposes(cluster)
  logger.info("epl.init: worker %d of %d serves %s at %s (%d %s device(s))",
              cluster.worker_index, cluster.worker_num, server.target,
              cluster.worker_addresses[cluster.worker_index],
              cluster.devices_per_worker, cluster.device_type)
  return server


def _say_what_the_job_exposes(cluster):
  """Worker 0's one line on what the job's servers open, when this
  machine's network is reachable from other hosts (not so in the private
  network namespace epl-launch gives a one-machine job): TensorFlow's
  servers listen on every interface and authenticate nobody."""
  if cluster.worker_index != 0:
    return
  interfaces = sorted(network_namespace.exposed_interfaces())
  if not interfaces:
    return
  logger.warning(
      "epl.init: the job's %d gRPC servers listen on every interface of "
      "their machines (here %s besides loopback), at %s; they accept "
      "connections from any host that reaches them, without "
      "authentication, and run the graphs it sends: keep these ports "
      "closed to all but the job's machines (docs/security.md)", cluster.worker_num,
      ", ".join(interfaces), ", ".join(cluster.worker_addresses))


def current():
  """The tf.distribute.Server this process started, EAGER when the eager
  context serves this worker, or None."""
  return _server["server"]


def session_workers(env, graph):
  """The workers whose devices a session on this worker uses, in order.

  This worker, plus the workers that hold later pipeline stages of its
  replicas (from the plan, when the model is already annotated).
  """
  workers = {env.cluster.worker_index}
  plan = planner.plan_of(graph) if graph is not None else None
  if plan is not None:
    for replica in plan.local_replicas:
      workers.update(plan.device_workers[replica])
  return sorted(workers)
