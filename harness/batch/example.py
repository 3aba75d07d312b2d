"""``python -m harness.batch.example N PATH``: an OpenAI Batch file of N tiny requests, to try or measure troughput-batch.

Chat and completions alternate; prompts are 3-8 words, ``max_tokens`` 1-4, greedy
(``temperature: 0``); seeded, so the same N gives the same file.
"""

from __future__ import annotations

import json
import random
import sys

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda sigma".split()


def write_example(count: int, path: str, seed: int = 0) -> None:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(count):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8)))
            body = {"model": "tiny", "max_tokens": rng.randint(1, 4), "temperature": 0}
            if i % 2:
                line = {"url": "/v1/chat/completions", "body": {**body, "messages": [{"role": "user", "content": text}]}}
            else:
                line = {"url": "/v1/completions", "body": {**body, "prompt": text}}
            f.write(json.dumps({"custom_id": f"request-{i}", "method": "POST", **line}) + "\n")


if __name__ == "__main__":
    write_example(int(sys.argv[1]), sys.argv[2])
