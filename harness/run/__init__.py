"""One run: a config becomes a spec, one worker process per replica, and one row in the results table."""
