"""What a running job exposes, seen from the namespace that started it.

    job_exposure.py WORKERS RELEASE -- LAUNCHER_ARGS [-- LAUNCHER_ARGS ...]

Starts one `epl-launch` per LAUNCHER_ARGS (each followed by
tests/workers/serve_worker.py RELEASE), waits until WORKERS workers in all
print `serving`, then records the TCP ports listening in this namespace
(`multiworker.listening`: what `ss -ltn` shows) and whether each port of
the cluster accepts a connection on 127.0.0.1 here; then creates RELEASE,
waits for the launchers and prints one JSON object: `listening` [[address,
port]], `connects` {port: bool}, `outputs`, `returncodes`.
"""
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from tests import multiworker  # noqa: E402

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      "serve_worker.py")


def _connects(port):
  try:
    with socket.create_connection(("127.0.0.1", port), timeout=2):
      return True
  except OSError:
    return False


def main():
  workers, release = int(sys.argv[1]), sys.argv[2]
  groups, current = [], None
  for arg in sys.argv[3:]:
    if arg == "--":
      current = []
      groups.append(current)
    else:
      current.append(arg)
  outputs = [[] for _ in groups]
  processes = [subprocess.Popen(  # pylint: disable=consider-using-with
      [sys.executable, "-m", "epl.tools.launcher"] + group +
      [WORKER, release], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      text=True) for group in groups]
  pumps = [threading.Thread(target=lambda p=p, o=o: o.extend(p.stdout))
           for p, o in zip(processes, outputs)]
  for pump in pumps:
    pump.start()
  deadline = time.monotonic() + 120
  while (sum("] serving " in line for o in outputs for line in o) < workers
         and time.monotonic() < deadline
         and any(p.poll() is None for p in processes)):
    time.sleep(0.2)
  ports = [int(p) for o in outputs for line in o
           for p in re.findall(r"started \(pid \d+, [^:]+:(\d+)\)", line)]
  report = {"listening": multiworker.listening(),
            "connects": {port: _connects(port) for port in ports}}
  with open(release, "w"):
    pass
  for process, pump in zip(processes, pumps):
    process.wait(timeout=60)
    pump.join()
  report.update(outputs=["".join(o) for o in outputs],
                returncodes=[p.returncode for p in processes])
  print(json.dumps(report))


if __name__ == "__main__":
  main()
