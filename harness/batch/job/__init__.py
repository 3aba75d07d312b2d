"""The batch job itself: its plan, shards, conversion, output lines, committed state, and its results row."""
