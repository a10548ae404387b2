"""Running the rewritten graph: sessions, servers, checkpoints, summaries,
worker failures, the Estimator, and measuring memory per device."""
