"""The Workload record: a named, deterministic list of requests with a content fingerprint."""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from engines.base import Request
from harness.core.errors import TroughputError


@dataclass
class Workload:
    """Requests plus what is known about them.

    Args:
        name: the workload's config name (``unique``, ``prefix_heavy``, ...).
        requests: in generation order; ids unique.
        groups: per request, the prefix group it was generated in (``None`` if unknown).
        info: facts computed at build time (e.g. ``ideal_prefix_hit_tokens``), copied into rows.
        expected: request id -> the answer a user's file expects (``harness.quality.expected``).
    """

    name: str
    requests: list[Request]
    groups: list[str | None] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    expected: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        ids = [r.id for r in self.requests]
        if len(set(ids)) != len(ids):
            seen: set[str] = set()
            dupes = sorted({i for i in ids if i in seen or seen.add(i)})  # type: ignore[func-returns-value]
            raise TroughputError(f"workload {self.name!r} has duplicate request ids: {dupes[:5]}")
        if not self.requests:
            raise TroughputError(f"workload {self.name!r} has no requests")
        if not self.groups:
            self.groups = [None] * len(self.requests)
        self.fingerprint = fingerprint(self.requests)

    def sample(self, fraction: float, seed: int = 0) -> Workload:
        """A seeded random ``fraction`` of the requests (at least one), in their original order.

        Build-time ``info`` does not carry over: the sample's statistics are its own.
        """
        if not 0 < fraction <= 1:
            raise TroughputError(f"a workload sample needs a fraction in (0, 1], got {fraction!r}")
        count = max(1, round(fraction * len(self.requests)))
        keep = sorted(random.Random(seed).sample(range(len(self.requests)), count))
        kept = [self.requests[i] for i in keep]
        return Workload(self.name, kept, [self.groups[i] for i in keep],
                        expected={r.id: self.expected[r.id] for r in kept if r.id in self.expected})

    def summary(self) -> dict[str, Any]:
        """Counts that go into every results row, with the prefix statistics of ``harness.workloads.prefix_tree``.

        ``ideal_prefix_hit_tokens_tree`` / ``ideal_prefix_hit_rate``: prompt tokens an unbounded
        prefix cache could serve (token level), and their share of all prompt tokens, the ceiling
        for a measured ``prefix_cache_hit_rate``; ``..._block16`` / ``..._block32``: the same when
        only whole blocks of that many tokens are cached, as engines do. Images count as one
        pseudo-token each (``prefix_tree.prompt_keys``). Computed once per workload.
        """
        return dict(self._summary)

    @cached_property
    def _summary(self) -> dict[str, Any]:
        from harness.workloads import prefix_tree

        images = [img for r in self.requests for img in r.images]
        tree = prefix_tree.PrefixTree(prefix_tree.prompt_keys(self.requests), block_size=16)
        return {
            "requests": len(self.requests),
            "input_tokens_requested": sum(len(r.prompt_token_ids) for r in self.requests),
            "output_tokens_requested": sum(r.max_tokens for r in self.requests),
            "images": len(images),
            "unique_images": len(set(images)),
            "constrained_requests": sum(1 for r in self.requests if r.constraint),
            "sampled_requests": sum(1 for r in self.requests if r.sampling),
            **tree.stats(block_sizes=(1, 16, 32)),
            **self.info,
        }


def fingerprint(requests: list[Request]) -> str:
    """A short sha256 over ids, token ids, output lengths, image contents, and a request's own sampling and constraint.

    A benchmark request (no sampling, no constraint) hashes as it always has, so earlier results stay comparable.
    """
    digest = hashlib.sha256()
    for r in requests:
        image_digests = [_file_digest(p) for p in r.images]
        fields: list = [r.id, r.prompt_token_ids, r.max_tokens, image_digests]
        if not r.exact_length:
            fields += [r.sampling, r.constraint]
        digest.update(json.dumps(fields, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def _file_digest(path: str) -> str:
    name = Path(path).stem
    # Generated images are stored under their own content digest; anything else is hashed.
    if len(name) == 64 and all(c in "0123456789abcdef" for c in name):
        return name
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
