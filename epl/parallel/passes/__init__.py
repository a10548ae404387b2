"""The rewrite passes and the pass manager that orders and runs them."""
