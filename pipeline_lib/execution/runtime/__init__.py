"""The runtime: a job's pipelines, each one's restore, plan and epoch loop, its lifecycle and stop."""
