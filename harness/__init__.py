"""troughput's driver side in rooms, by the data flow (docs/design.md#rooms)."""
