"""Ordering: the order in which an engine sees a workload's requests (``policies``)."""
