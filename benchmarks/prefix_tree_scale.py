"""Prefix tree at scale: build time and peak memory for 100k prompts of 2k tokens.

    .venv/bin/python benchmarks/prefix_tree_scale.py [--requests 100000] [--tokens 2048] [--block-size 16]

The prompts: ``--grouped`` of them (default half) fall into ``--groups`` groups sharing a prefix of
``--prefix-share`` of the prompt (nested: every group also starts with one common system prompt of
``--system`` tokens), the rest share nothing. Token ids are drawn from a pool of ordinary ids, and
each prompt is a list of Python ints like a workload's, built before measuring. The tree is built
twice: once timed (build, depth-first order, groups, statistics at block sizes 1, 16 and 32), once
under ``tracemalloc`` for the peak memory the build allocates (the prompts themselves excluded).
"""

from __future__ import annotations

import argparse
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.workloads.prefix_tree import PrefixTree  # noqa: E402


def make_prompts(args: argparse.Namespace, rng: np.random.Generator) -> list[list[int]]:
    """``args.requests`` prompts of ``args.tokens`` tokens, slices of one shared pool of ints."""
    pool = rng.integers(4, 32000, size=4_000_000).tolist()
    length = args.tokens

    def window(n: int) -> list[int]:
        start = int(rng.integers(0, len(pool) - n))
        return pool[start:start + n]

    system = window(args.system)
    prefix_len = int(length * args.prefix_share)
    prefixes = [system + window(prefix_len - args.system) for _ in range(args.groups)]
    grouped = rng.random(args.requests) < args.grouped
    group_of = rng.integers(0, args.groups, size=args.requests)
    return [prefixes[g] + window(length - prefix_len) if shared else window(length)
            for shared, g in zip(grouped.tolist(), group_of.tolist())]


def build(prompts: list[list[int]], block_size: int) -> tuple[PrefixTree, dict[str, float]]:
    tree = PrefixTree(prompts, block_size)
    tree.order()
    tree.groups(block_size)
    return tree, tree.stats((1, 16, 32))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--grouped", type=float, default=0.5, help="share of prompts that belong to a group")
    parser.add_argument("--prefix-share", type=float, default=0.75, help="group prefix / prompt length")
    parser.add_argument("--system", type=int, default=256, help="tokens of the system prompt all groups share")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    t0 = time.perf_counter()
    prompts = make_prompts(args, np.random.default_rng(args.seed))
    tokens = sum(map(len, prompts))
    print(f"{len(prompts):,} prompts, {tokens:,} tokens (made in {time.perf_counter() - t0:.1f} s); "
          f"tree block size {args.block_size}", flush=True)

    t0 = time.perf_counter()
    tree, stats = build(prompts, args.block_size)
    seconds = time.perf_counter() - t0
    nodes = len(tree.parent)
    del tree
    tracemalloc.start()
    traced_tree, _ = build(prompts, args.block_size)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    kept = sum(a.nbytes for a in (traced_tree.parent, traced_tree.depth, traced_tree.rep, traced_tree.leaf))
    print(f"build + order + groups + stats: {seconds:.2f} s ({tokens / seconds / 1e6:.1f} M tokens/s)")
    print(f"peak memory of the build: {peak / 2**20:.0f} MiB ({peak / tokens:.2f} bytes per prompt token); "
          f"the finished tree: {nodes:,} compressed nodes, {kept / 2**20:.1f} MiB of arrays")
    for key, value in stats.items():
        print(f"  {key}: {value:,.4f}" if isinstance(value, float) else f"  {key}: {value:,}")


if __name__ == "__main__":
    main()
