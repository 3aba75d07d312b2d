"""troughput's driver side: workloads, ordering, runner, results table and the CLI apps."""
