"""In-job tuning (``batch.tune``): the tuner's trials on the job's first shards; the confirmed config runs the rest."""
