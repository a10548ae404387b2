"""A worker that only serves (started by epl-launch): `epl.init` starts its
gRPC server; it prints `serving <task>` and exits 0 once RELEASE exists (or
after 60 s)."""
import os
import sys
import time

import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import epl  # noqa: E402


def main():
  release = sys.argv[1]
  tf.compat.v1.disable_eager_execution()
  epl.init()
  print("serving %d" % epl.Env.get().cluster.worker_index, flush=True)
  deadline = time.monotonic() + 60
  while not os.path.exists(release) and time.monotonic() < deadline:
    time.sleep(0.1)


if __name__ == "__main__":
  main()
