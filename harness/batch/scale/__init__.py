"""Where a job's shards run (``batch.scale``): this node's engine pool, SLURM array tasks, or a Ray Data pipeline."""
