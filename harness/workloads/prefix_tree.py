"""A prefix tree over prompt token ids: depth-first order, prefix groups and ideal-cache statistics.

The tree is built at block granularity, as engines' prefix caches work: each
prompt is cut into blocks of ``block_size`` tokens, and a node is a distinct
*block prefix* (the first k whole blocks of some prompt), identified by a 64-bit
hash chained over the blocks. Building is vectorized: Python's C-level tuple hash
per block (``map(hash, zip(*[iter(p)] * b))``) and numpy for chaining, sorting
and counting, so 100k prompts of 2k tokens take seconds.

Memory stays bounded: tokens are never copied. The build holds a few machine
words per *block* (not per token); the finished tree keeps only its compressed
form (root, branch nodes and nodes where prompts end: at most about 2n nodes for
n prompts), each edge being a slice ``(request, start, end)`` of one original
prompt. Partial blocks and the token-level refinement needed for exact
statistics are read from the prompts themselves, only where the tree branches.

Statistics: an ideal cache (unbounded, never evicting) serves every prompt token
that is part of a prefix some other prompt has already computed, i.e. the prompt
tokens minus the distinct token prefixes of the workload. At block size ``b`` it
serves only whole blocks: the whole-block tokens minus ``b`` times the distinct
b-block prefixes. Both are independent of the order. (Engines also recompute at
least a prompt's last token, so an exact duplicate of a whole-block prompt
loses one block against this ceiling.) A 64-bit hash collision, about
``M**2 / 2**65`` for ``M`` blocks, would merge two nodes; that is ~1e-5 at 10M blocks.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import itertools
from typing import Iterator, Sequence

import numpy as np

from engines.base import Request

_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_GOLDEN, _DEPTH = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xD6E8FEB86659FD93)
_SLICE = 1 << 16  # blocks per slice of work arrays while hashing


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, in place on a uint64 array."""
    x ^= x >> np.uint64(30)
    x *= _M1
    x ^= x >> np.uint64(27)
    x *= _M2
    x ^= x >> np.uint64(31)
    return x


def prompt_keys(requests: Sequence[Request]) -> list[Sequence[int]]:
    """What a prefix cache keys each request on: its token ids, led by one pseudo-token per image.

    Engines hash image contents into the keys of the blocks that hold an image's tokens, so two
    prompts whose placeholder tokens agree share nothing unless their images do. Each image
    becomes a negative id from its path's digest (generated images are named by their content),
    placed first, where the placeholders of generated prompts are; a request without images
    is keyed on its token list itself (not copied).
    """
    keys: list[Sequence[int]] = []
    for r in requests:
        if r.images:
            pseudo = [-2 - int.from_bytes(hashlib.blake2b(p.encode(), digest_size=7).digest(), "big") for p in r.images]
            keys.append(pseudo + list(r.prompt_token_ids))
        else:
            keys.append(r.prompt_token_ids)
    return keys


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector: it would walk every prompt list each time the build allocates."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n, i = min(len(a), len(b)), 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _trie_size(strings: set[tuple[int, ...]]) -> int:
    """Distinct non-empty prefixes of ``strings`` (the nodes of their token-level trie)."""
    ordered = sorted(strings)
    return sum(map(len, ordered)) - sum(_lcp(a, b) for a, b in zip(ordered, ordered[1:]))


class PrefixTree:
    """A compressed prefix tree over ``prompts``, built once.

    Args:
        prompts: token-id sequences (lists, tuples or 1-d integer arrays); only read.
        block_size: tokens per block, the tree's granularity (requests sharing less than
            one block are not grouped). Statistics are exact at any block size that is 1
            or a multiple of this one.

    Attributes:
        num_requests, total_tokens: the workload's size.
        depth, parent, rep: per compressed node (0 is the root): depth in blocks, parent
            node (-1 for the root), and the first request through it; the node's edge is
            ``prompts[rep][depth[parent] * block_size : depth * block_size]``.
        leaf: per request, the node where its whole blocks end.
    """

    def __init__(self, prompts: Sequence[Sequence[int]], block_size: int = 16):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.prompts = prompts
        self.block_size = int(block_size)
        self.num_requests = len(prompts)
        with _no_gc():
            self._build()

    # -- building ---------------------------------------------------------------------------------
    def _build(self) -> None:
        b, n = self.block_size, self.num_requests
        lengths = np.fromiter(map(len, self.prompts), dtype=np.int64, count=n)
        self.total_tokens = int(lengths.sum())
        self._lengths = lengths
        blocks = lengths // b
        starts = np.concatenate([[0], np.cumsum(blocks)]).astype(np.int64)
        # Node id per block prefix (ids in order of first appearance), and where each first appears.
        node, first = self._node_ids(blocks, starts)
        num_nodes = len(first)
        # Per full node: the first request through it, its depth and its parent (-1: the root).
        req = (np.searchsorted(starts, first, side="right") - 1).astype(np.int32)
        depth = (first - starts[req] + 1).astype(np.int32)
        parent = np.full(num_nodes, -1, dtype=np.int32)
        parent[depth > 1] = node[first[depth > 1] - 1]
        leaf = np.full(n, -1, dtype=np.int32)
        leaf[blocks > 0] = node[starts[1:][blocks > 0] - 1]
        del node, first
        children = np.bincount(parent + 1, minlength=num_nodes + 1)  # index 0 is the root
        ending = np.bincount(leaf + 1, minlength=num_nodes + 1)
        self._depth_counts = np.bincount(depth)
        self._distinct_token_prefixes = self._count_token_prefixes(parent, req, depth, leaf, children)
        self._compress(parent, req, depth, leaf, children, ending)

    def _block_prefix_keys(self, blocks: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """One 64-bit key per (request, k): a hash of the request's first k+1 whole blocks.

        Work arrays are made per slice of ``_SLICE`` blocks, so the build holds one word per block.
        """
        b, total = self.block_size, int(starts[-1])
        chunks = itertools.chain.from_iterable(map(hash, zip(*[iter(p)] * b)) for p in self.prompts)
        keys = np.fromiter(chunks, dtype=np.int64, count=total).view(np.uint64)
        slices = [(lo, min(total, lo + _SLICE)) for lo in range(0, total, _SLICE)]
        for lo, hi in slices:  # block content and its position in the request, mixed
            owner = np.searchsorted(starts, np.arange(lo, hi), side="right") - 1
            position = np.arange(lo, hi, dtype=np.uint64) - starts[owner].astype(np.uint64)
            keys[lo:hi] += (position + np.uint64(1)) * _GOLDEN
            _mix(keys[lo:hi])
        np.cumsum(keys, out=keys)  # chained over all blocks; below, restarted at each request
        for lo, hi in reversed(slices):  # backwards: the sums a slice subtracts lie at or before it
            owner = np.searchsorted(starts, np.arange(lo, hi), side="right") - 1
            before = starts[owner] - 1
            base = np.where(before >= 0, keys[np.maximum(before, 0)], np.uint64(0))
            position = np.arange(lo, hi, dtype=np.uint64) - starts[owner].astype(np.uint64)
            keys[lo:hi] -= base
            keys[lo:hi] += position * _DEPTH
            _mix(keys[lo:hi])
        return keys

    def _node_ids(self, blocks: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(node id per block prefix, position of each node's first occurrence), ids in first-occurrence order."""
        keys = self._block_prefix_keys(blocks, starts)
        if len(keys) == 0:
            return np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int64)
        order = np.argsort(keys)
        keys.sort()  # in place: no second copy
        new = np.empty(len(keys), dtype=bool)
        new[0] = True
        np.not_equal(keys[1:], keys[:-1], out=new[1:])
        del keys
        order = order.astype(np.int32 if len(order) < 2**31 else np.int64)
        first = np.minimum.reduceat(order, np.flatnonzero(new))  # per distinct key, in key order
        seen = np.zeros(len(order), dtype=bool)
        seen[first] = True
        # A node's id: how many distinct keys first appeared before it.
        rank = (np.cumsum(seen, dtype=np.int32) - 1)[first]
        ids = np.cumsum(new, dtype=np.int32)
        del new
        ids -= 1
        node = np.empty(len(order), dtype=np.int32)
        node[order] = rank[ids]
        return node, np.flatnonzero(seen)

    def _count_token_prefixes(self, parent: np.ndarray, req: np.ndarray, depth: np.ndarray, leaf: np.ndarray,
                              children: np.ndarray) -> int:
        """Distinct token prefixes: per node, the token-level trie of what follows it (child blocks, tails)."""
        b, lengths = self.block_size, self._lengths
        tails = lengths % b
        has_tail = tails > 0
        tail_count = np.bincount(leaf[has_tail] + 1, minlength=len(children))
        branching = (children + tail_count) >= 2
        # Simple nodes: one child block (b new prefixes) or one tail (its length).
        total = int(b * np.count_nonzero((children == 1) & (tail_count == 0)))
        single_tail = has_tail & ~branching[leaf + 1]
        total += int(tails[single_tail].sum())
        # Branching nodes: sort their continuations and count their trie, in Python (at most ~2n of them).
        follow: dict[int, set[tuple[int, ...]]] = {}
        kids = np.flatnonzero(branching[parent + 1])
        for x, r, d in zip((parent[kids] + 1).tolist(), req[kids].tolist(), depth[kids].tolist()):
            follow.setdefault(x, set()).add(tuple(self.prompts[r][(d - 1) * b:d * b]))
        for i in np.flatnonzero(has_tail & branching[leaf + 1]).tolist():
            follow.setdefault(int(leaf[i]) + 1, set()).add(tuple(self.prompts[i][int(lengths[i] - tails[i]):]))
        return total + sum(_trie_size(s) for s in follow.values())

    def _compress(self, parent: np.ndarray, req: np.ndarray, depth: np.ndarray, leaf: np.ndarray,
                  children: np.ndarray, ending: np.ndarray) -> None:
        """Keep the root, branch nodes and nodes where requests end; find each one's nearest kept ancestor."""
        keep = (children != 1) | (ending > 0)
        keep[0] = True
        anc = parent + 1  # shifted ids: 0 is the root
        while True:  # pointer jumping: O(log depth) rounds
            jump = np.flatnonzero((anc > 0) & ~keep[anc])
            if jump.size == 0:
                break
            anc[jump] = anc[anc[jump] - 1]
        kept = np.flatnonzero(keep[1:])  # full-node ids, ascending = first-appearance order
        new_id = np.full(len(keep), -1, dtype=np.int64)
        new_id[0] = 0
        new_id[kept + 1] = np.arange(1, len(kept) + 1)
        self.parent = np.concatenate([[-1], new_id[anc[kept]]])
        self.depth = np.concatenate([[0], depth[kept]]).astype(np.int64)
        self.rep = np.concatenate([[-1], req[kept]]).astype(np.int64)
        self.leaf = new_id[leaf + 1]

    # -- queries ----------------------------------------------------------------------------------
    def order(self) -> np.ndarray:
        """Request indices in depth-first order: each subtree contiguous.

        At each node, its child subtrees and the requests whose whole blocks end there go in
        order of first appearance, so requests that share no whole block keep their input order.
        """
        if not hasattr(self, "_order"):
            with _no_gc():
                self._order, self._preorder = self._depth_first()
        return self._order

    def _depth_first(self) -> tuple[np.ndarray, np.ndarray]:
        n, num = self.num_requests, len(self.parent)
        # Items under each node: child nodes (coded n + node) and requests ending there, by first appearance.
        item = np.concatenate([np.arange(n), n + np.arange(1, num)])
        under = np.concatenate([self.leaf, self.parent[1:]])
        first = np.concatenate([np.arange(n), self.rep[1:]])
        by_node = np.lexsort((first, under))
        start = np.searchsorted(under[by_node], np.arange(num + 1)).tolist()
        items = item[by_node].tolist()
        out: list[int] = []
        preorder: list[int] = [0]
        stack = items[start[0]:start[1]][::-1]
        while stack:
            x = stack.pop()
            if x < n:
                out.append(x)
            else:
                x -= n
                preorder.append(x)
                stack.extend(items[start[x]:start[x + 1]][::-1])
        return np.asarray(out, dtype=np.int64), np.asarray(preorder, dtype=np.int64)

    def groups(self, min_shared_tokens: int) -> np.ndarray:
        """Per request, a group id shared exactly by requests with a common prefix of ``min_shared_tokens``.

        Rounded up to whole blocks (at least one). Requests sharing that much with no other
        request get -1. Group ids follow the depth-first order.
        """
        need = max(1, -(-int(min_shared_tokens) // self.block_size))
        self.order()
        top = np.full(len(self.parent), -1, dtype=np.int64)  # the shallowest kept node at depth >= need
        for x in self._preorder[1:].tolist():
            if self.depth[x] >= need:
                above = top[self.parent[x]]
                top[x] = above if above >= 0 else x
        group = top[self.leaf]
        sizes = np.bincount(group + 1, minlength=len(self.parent) + 1)[1:]
        group[(group >= 0) & (sizes[np.maximum(group, 0)] < 2)] = -1
        ids = np.full(len(self.parent), -1, dtype=np.int64)
        seen = group[self._order]
        firsts = seen[seen >= 0]
        _, first_at = np.unique(firsts, return_index=True)
        ordered = firsts[np.sort(first_at)]
        ids[ordered] = np.arange(len(ordered))
        return np.where(group >= 0, ids[np.maximum(group, 0)], -1)

    def ideal_hit_tokens(self, block_size: int = 1) -> int:
        """Prompt tokens an unbounded cache could serve, at token (1) or ``block_size`` granularity."""
        if block_size == 1:
            return self.total_tokens - self._distinct_token_prefixes
        if block_size % self.block_size:
            raise ValueError(f"block size {block_size} is neither 1 nor a multiple of the tree's {self.block_size}")
        q = block_size // self.block_size
        whole = int((self._lengths // block_size).sum()) * block_size
        return whole - block_size * int(self._depth_counts[q::q].sum())

    def stats(self, block_sizes: Sequence[int] = (1,)) -> dict[str, float]:
        """``ideal_prefix_hit_tokens_tree`` and ``ideal_prefix_hit_rate`` (token level), and per other size b,
        ``ideal_prefix_hit_tokens_block{b}`` and ``ideal_prefix_hit_rate_block{b}``; rates are shares of all
        prompt tokens, comparable with an engine's measured prefix-cache hit rate."""
        out: dict[str, float] = {}
        for size in block_sizes:
            hits = self.ideal_hit_tokens(size)
            suffix = "" if size == 1 else f"_block{size}"
            out["ideal_prefix_hit_tokens" + ("_tree" if size == 1 else suffix)] = hits
            out["ideal_prefix_hit_rate" + suffix] = hits / self.total_tokens if self.total_tokens else 0.0
        return out
