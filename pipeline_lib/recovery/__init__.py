"""Recovery: deciding, per pipeline and subtask, what a restore rebuilds and what it skips."""
