"""`epl.init` on bad TF_CONFIG and EPL_* values, in one process.

    bad_input.py CASES_JSON

CASES_JSON is a list of environments ({variable: value}); for each, with
TF_CONFIG and every EPL_* variable replaced by the case's, runs
`epl.init()` and records the error it raises (type and message, or null)
and the TCP ports listening in this network namespace right after. Prints
one JSON list of {"error", "listening"}.
"""
import json
import os
import sys

import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import epl  # noqa: E402
from tests import multiworker  # noqa: E402


def main():
  tf.compat.v1.disable_eager_execution()
  results = []
  for case in json.loads(sys.argv[1]):
    for name in [n for n in os.environ
                 if n == "TF_CONFIG" or n.startswith("EPL_")]:
      del os.environ[name]
    os.environ.update(case)
    try:
      epl.init()
      error = None
    except Exception as caught:  # pylint: disable=broad-except
      error = "%s: %s" % (type(caught).__name__, caught)
    epl.shutdown()
    results.append({"error": error, "listening": multiworker.listening()})
  print(json.dumps(results))


if __name__ == "__main__":
  main()
