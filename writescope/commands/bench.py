"""``writescope bench``: decode throughput of every KV policy (and peers) over a grid.

    writescope bench --model qwen3-30b-a3b --random-weights --vram-budget 32GiB \\
        --batch 1,4,16 --context-lengths 1k,8k,32k,128k --decode-steps 32 \\
        --policies writescope,transfer,cpu,static,migrate --peer transformers --out bench/results/grid

For every model x batch x context x policy: decode tokens/s, mean/p50/p99 step time, time to
first token, peak VRAM (must stay within the budget), pinned and host bytes, bytes moved after
placement, the roofline model's step time and bound. Writes ``results.json`` (rewritten after
every row), ``results.md`` and PNG plots into ``--out``. A configuration that cannot run is a
row with its reason and the run goes on. See ``writescope/bench/grid.py``.
"""
from __future__ import annotations

import argparse
import shlex
import sys


def register(subparsers) -> None:
    from ..bench.grid import DEFAULT_POLICIES
    p = subparsers.add_parser("bench", help="benchmark the KV policies (and peers) over a grid",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", metavar="PATH|NAME",
                   help="checkpoint folder, deepseek-v2-lite | qwen3-30b-a3b | mixtral-8x7b "
                        "(with --random-weights), or writescope-default (the embedded default "
                        "model; repeatable, or comma-separated)")
    p.add_argument("--random-weights", action="store_true", help="seeded random weights at full size")
    p.add_argument("--config-override", action="append", default=[], metavar="KEY=VALUE",
                   help="change a config.json key of every model (with --random-weights): the same "
                        "architecture at a reduced size, e.g. num_hidden_layers=2,hidden_size=256 "
                        "(repeatable or comma-separated; recorded in the results' model meta)")
    p.add_argument("--vram-budget", default=None, help="everything the engine puts on the GPU, e.g. 32GiB")
    p.add_argument("--pinned-budget", default=None, help="pinned host memory for the T region")
    p.add_argument("--host-budget", default=None, help="pageable host memory for the C region")
    p.add_argument("--batch", default="1", metavar="B1,B2,...", help="batch sizes (default 1)")
    p.add_argument("--context-lengths", default="1k,8k", metavar="L1,L2,...",
                   help="prompt tokens per sequence, e.g. 1k,8k,32k,128k (default 1k,8k)")
    p.add_argument("--decode-steps", type=int, default=32, help="timed decode steps per row (default 32)")
    p.add_argument("--policies", default=",".join(DEFAULT_POLICIES), metavar="P1,P2,...",
                   help=f"KV policies (default {','.join(DEFAULT_POLICIES)}); a variant "
                        "NAME@ATTR=NUMBER[@...] sets its placement policy's attribute, e.g. "
                        "writescope@placement_cpu_margin=1.0 beside writescope, to compare two "
                        "settings in one run (with --rounds, alternated); @cpu_threads=N and "
                        "@expert_threads=N set the CPU attention and CPU experts' team sizes, "
                        "@expert_link=S the link's share of small decode steps' CPU experts "
                        "(0: none), @split_spilled=1 runs spilled decode steps with the experts "
                        "on the CPU as two sub-batches, @team_lock=0 lets the CPU job queues' "
                        "thread teams run at once")
    p.add_argument("--peer", action="append", default=[], metavar="NAME",
                   help="external peer run on the same weights and prompts: transformers")
    p.add_argument("--peer-offload-weights", action="store_true",
                   help="let accelerate keep the peer's weights beyond 60%% of the budget in host "
                        "memory")
    p.add_argument("--out", default="bench/results/grid", metavar="DIR", help="output folder")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when present)")
    p.add_argument("--seed", type=int, default=0, help="weights and prompts seed")
    p.add_argument("--num-gpu-blocks", type=int, default=None, help="cap on G-region blocks")
    p.add_argument("--kv-cache-memory", default=None,
                   help="device memory for the KV cache, e.g. 12GiB; with --experts auto the "
                        "routed experts are placed around it (default: what the weights leave); "
                        "auto: the split the planner predicts fastest for the largest batch of "
                        "the longest context")
    p.add_argument("--block-size", type=int, default=None,
                   help="tokens per KV block, even (default: 64)")
    p.add_argument("--experts", default="auto", choices=("auto", "gpu", "cpu"))
    p.add_argument("--cpu-threads", type=int, default=None, help="threads for CPU attention")
    p.add_argument("--profile", default=None, help="hardware profile JSON (writescope calibrate)")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192,
                   help="prefill chunk (tokens per step, default 8192)")
    p.add_argument("--static-share", type=float, default=None,
                   help="the static policy's CPU share (default: from the profile at "
                        "--static-ref-length and the largest --batch)")
    p.add_argument("--static-ref-length", default=None,
                   help="reference length the static share is chosen at (default: the longest "
                        "--context-lengths)")
    p.add_argument("--warmup-length", default=None, metavar="N",
                   help="tokens of the warm-up's long request (default: the shortest context); "
                        "a grid of 128K contexts need not prefill 128K more per policy to warm up")
    p.add_argument("--length-spread", default="0", metavar="N",
                   help="prompt i of a batch of B is N*i/B tokens shorter than the context "
                        "(default 0); a KV block's worth (--block-size, 64 by default) makes the "
                        "sequences complete their blocks on different steps, as a server's do")
    p.add_argument("--prefill", default="real", choices=("real", "synthetic"),
                   help="real: prefill each row's prompts through the model (default); synthetic: "
                        "write random KV to the homes the placement policy chooses, all but each "
                        "prompt's last token -- the same decode steps, no TTFT, seconds per row")
    p.add_argument("--rounds", type=int, default=1, metavar="N",
                   help="run the policies' rows N times, each round in the reverse order of the "
                        "last; the summary pairs writescope with the other policies round by round "
                        "and takes the median of each pair's ratios (default 1)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--report", metavar="DIR", nargs="+",
                   help="run nothing: (re)write the summary, results.md and plots of "
                        "DIR/results.json (e.g. of a run that was cut short); with several DIRs, "
                        "merge their rows into --out")
    p.set_defaults(func=run)


def spec_from_args(args: argparse.Namespace):
    from ..bench.grid import GridSpec, parse_int_list, parse_name_list, parse_overrides
    from ..units import parse_count
    return GridSpec(
        models=parse_name_list(args.model), batches=parse_int_list(args.batch),
        context_lengths=parse_int_list(args.context_lengths), decode_steps=args.decode_steps,
        policies=parse_name_list(args.policies), peers=parse_name_list(args.peer), out=args.out,
        random_weights=args.random_weights, dtype=args.dtype, device=args.device, seed=args.seed,
        vram_budget=args.vram_budget, pinned_budget=args.pinned_budget, host_budget=args.host_budget,
        num_gpu_blocks=args.num_gpu_blocks, block_size=args.block_size, experts=args.experts,
        kv_cache_memory=args.kv_cache_memory,
        cpu_threads=args.cpu_threads, profile=args.profile,
        max_num_batched_tokens=args.max_num_batched_tokens, static_share=args.static_share,
        static_ref_length=(parse_count(args.static_ref_length) if args.static_ref_length
                           else None),
        warmup_length=parse_count(args.warmup_length) if args.warmup_length else None,
        length_spread=parse_count(args.length_spread),
        prefill=args.prefill,
        peer_offload_weights=args.peer_offload_weights,
        config_overrides=parse_overrides(args.config_override), rounds=args.rounds,
        command="writescope " + " ".join(shlex.quote(a) for a in sys.argv[1:]))


def run(args: argparse.Namespace) -> int:
    from ..bench.grid import run_grid
    from ..bench.report import markdown

    if args.report:
        return report_only(args.report, args.out if len(args.report) > 1 else args.report[0])
    if not args.model:
        raise ValueError("give --model (one or more), or --report DIR")
    spec = spec_from_args(args)
    spec.validate()  # the arguments' own errors first
    check_out(spec.out)
    from .common import check_profile
    check_profile(args.profile)
    check_models(spec)
    doc = run_grid(spec, progress=not args.no_progress)
    rows = doc["rows"]
    failed = sum(1 for r in rows if r.get("error"))
    md = markdown(doc)
    summary = md.split("## Rows")[0]
    print(summary.rstrip())
    print(f"\n{len(rows)} rows ({failed} failed) written to {spec.out}/results.json, results.md "
          "and the PNG plots", file=sys.stderr)
    if rows and failed == len(rows):
        print("writescope bench: every row failed (the reasons are in the rows above and in "
              "results.json)", file=sys.stderr)
        return 1
    return 0


def check_out(out: str) -> None:
    """``--out`` is a folder this process can write results into (made if missing): a file, or
    a place no file can be created, is the command's error naming the flag."""
    from pathlib import Path
    from .common import check_writable
    p = Path(out)
    if p.exists() and not p.is_dir():
        raise ValueError(f"--out {out} is a file; give a folder for results.json, results.md "
                         "and the plots")
    check_writable("--out", out, p, make=True)


def check_models(spec) -> None:
    """Every ``--model`` names a reference config or a folder with a config.json (and the
    overrides apply): a bad name is the command's error, before anything is built, not a
    failed row for every configuration of the grid."""
    from ..engine.model_source import resolve_model
    for name in spec.models:
        resolve_model(name, spec.random_weights, spec.config_overrides)


def report_only(folders: list[str], out: str) -> int:
    """Summary, markdown and plots of one results.json, or of several merged (rows and model
    facts concatenated; the first one's meta, with every source's command and commit listed)."""
    import json
    from pathlib import Path

    from ..bench.grid import clean_json
    from ..bench.report import summarize, write_report
    docs = []
    for folder in folders:
        path = Path(folder) / "results.json"
        if not path.exists():
            raise FileNotFoundError(f"no results.json in {folder}")
        docs.append(json.loads(path.read_text()))
    doc = docs[0]
    if len(docs) > 1:
        doc = {"meta": dict(docs[0].get("meta", {}), sources=[
                   {"folder": f, "command": d.get("meta", {}).get("command"),
                    "git": d.get("meta", {}).get("git"), "timestamp": d.get("meta", {}).get("timestamp")}
                   for f, d in zip(folders, docs)]),
               # a model may be in several runs (experts on the GPU in one, on the CPU in
               # another): each run's facts are kept, under the model and its folder
               "models": {f"{k} ({f})": v for f, d in zip(folders, docs)
                          for k, v in d.get("models", {}).items()},
               "rows": [r for d in docs for r in d.get("rows", [])]}
    doc["summary"] = summarize(doc.get("rows", []))
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "results.json").write_text(json.dumps(clean_json(doc), indent=1, allow_nan=False) + "\n")
    res = write_report(doc, out)
    print(f"wrote {Path(out) / 'results.json'}, {res['markdown']} and {len(res['plots'])} plots",
          file=sys.stderr)
    return 0
