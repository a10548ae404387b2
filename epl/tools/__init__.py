"""Command-line tools and inspection: `epl-launch`, `epl-plan` (dry run),
the timeline of a traced step."""
