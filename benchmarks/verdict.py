"""What a ratio in a benchmark table means for EPL, in words.

Every anchor table prints, beside a ratio of EPL against another way of
running the same model, whether EPL wins, loses or is level, so that a
loss is written where it is measured, not left to the reader.
"""

# Ratios within this fraction of 1 are level: on a shared machine step
# times move by a few percent between runs.
LEVEL = 0.05


def verdict(ratio, higher_is_better=True, level=LEVEL):
  """'EPL wins', 'EPL loses' or 'level' for `ratio` = EPL's figure over
  the other's (examples/s: higher is better; seconds, bytes: lower)."""
  if ratio != ratio:  # nan: nothing to compare
    return "-"
  if abs(ratio - 1.0) <= level:
    return "level"
  wins = ratio > 1.0 if higher_is_better else ratio < 1.0
  return "EPL wins" if wins else "EPL loses"


def ratio(numerator, denominator):
  """numerator / denominator, nan when the denominator is 0 (a figure that
  a row does not have, such as bytes sent by local sums)."""
  return numerator / denominator if denominator else float("nan")
