"""``troughput-batch``: run a user's batch file with the chosen config, in shards, resumably.

A job is the set of its committed shards. ``shards`` reads the file in shards of
``shard_size`` records, ``convert`` turns each record into a request (or an error),
a pool runs shards on engines started once (``pool``: this node's replicas;
``slurm``: submitit array tasks, each with a local pool; ``ray_job``: a Ray Data pipeline
of the stages in ``ray_stages``),
``output`` writes OpenAI Batch output lines, and ``state`` commits each shard atomically
and merges them. ``job`` drives it; ``source`` says where the config came from and what
it predicted; ``row`` records the job in the results table's ``batch`` table.

By role, lowest first: ``job/`` (the job itself), then ``scale/`` (where it runs) and ``tune/``
(in-job tuning), which import ``job/`` and not each other; ``launch`` (one invocation) and ``cli``
(the Hydra app) sit on top, ``example`` writes a file to try it with.
"""
