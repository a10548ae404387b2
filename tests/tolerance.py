"""The suite's tolerance for equivalence with single-device TF, in one
place. Imports no EPL, so model-only tests can use it too."""
import numpy as np

# The suite's policy for "the same numbers as single-device TF": float noise
# from another summation order (CPU kernels differ between machines), not a
# defect. Every equivalence check reads it here, so there is one number to
# change.
EQUIVALENCE_TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}
# AMP O1 against float32 training, 5 steps: half-precision rounding
# (float16 measured <= 8e-4; bfloat16 keeps 8 bits of mantissa).
AMP_TOLERANCE = {"float16": 2e-3, "bfloat16": 5e-3}


def assert_equivalent(actual, expected, err_msg=""):
  """`actual` equals `expected` within the suite's float-noise tolerance."""
  np.testing.assert_allclose(actual, expected, err_msg=err_msg,
                             **EQUIVALENCE_TOLERANCE)


def assert_same_ranking(indices, expected_indices, expected_scores):
  """Top-k or argmax `indices` equal the expected ones wherever the choice
  is clear: a position whose expected score lies within the tolerance of
  another score of its row is a near-tie that float noise may flip, and
  there only the score of the index chosen has to match."""
  indices = np.asarray(indices).reshape(len(expected_scores), -1)
  expected_indices = np.asarray(expected_indices).reshape(indices.shape)
  scores = np.asarray(expected_scores)
  margin = EQUIVALENCE_TOLERANCE["atol"] + EQUIVALENCE_TOLERANCE["rtol"] * (
      np.abs(scores).max())
  for row, (got, want) in enumerate(zip(indices, expected_indices)):
    for position, (got_index, want_index) in enumerate(zip(got, want)):
      gaps = np.abs(scores[row] - scores[row, want_index])
      gaps[want_index] = np.inf
      if gaps.min() > 2 * margin:
        assert got_index == want_index, (row, position, got, want)
      else:
        assert abs(scores[row, got_index] - scores[row, want_index]) <= (
            2 * margin), (row, position, got, want)
