"""Options every command that builds an engine shares (model, dtype, device, budgets, policy)."""
from __future__ import annotations

import argparse
import os


def add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model and engine")
    g.add_argument("--model", default=None,
                   help="checkpoint folder, or deepseek-v2-lite | qwen3-30b-a3b | mixtral-8x7b with "
                        "--random-weights (default: the embedded default model)")
    g.add_argument("--random-weights", action="store_true", help="seeded random weights at full size")
    g.add_argument("--dtype", default="bfloat16",
                   help="bfloat16 (default), float16, float32, or auto (the checkpoint's own "
                        "16-bit dtype, else bfloat16: vLLM's auto)")
    g.add_argument("--device", default=None, help="cuda or cpu (default: cuda when present)")
    g.add_argument("--seed", type=int, default=0,
                   help="random weights' seed; generate and chat also seed sampling with it "
                        "(generate: prompt i's samples from SEED + i * n)")
    g.add_argument("--vram-budget", default=None, help="everything the engine puts on the GPU, e.g. 32GiB")
    g.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="the budget as a fraction of the device's memory, as vLLM's (default "
                        "0.9 on CUDA; not with --vram-budget)")
    g.add_argument("--pinned-budget", default=None, help="pinned host memory for the T region")
    g.add_argument("--host-budget", default=None, help="pageable host memory for the C region")
    g.add_argument("--num-gpu-blocks", type=int, default=None, help="cap on G-region blocks")
    g.add_argument("--kv-cache-memory", default=None,
                   help="device memory for the KV cache, e.g. 12GiB; with --experts auto the "
                        "routed experts are placed around it (default: what the weights leave); "
                        "auto: the split the planner predicts fastest for --max-num-seqs "
                        "sequences of --max-model-len tokens")
    g.add_argument("--block-size", type=int, default=None,
                   help="tokens per KV block, even (default: 64)")
    g.add_argument("--kv-policy", default="writescope",
                   help="writescope (default), static, transfer, cpu, migrate")
    g.add_argument("--cpu-share", type=float, default=None,
                   help="CPU fraction of spilled KV, in [0, 1] (with --kv-policy static; "
                        "default 0.5)")
    g.add_argument("--experts", default="auto", choices=("auto", "gpu", "cpu"),
                   help="where routed experts run")
    g.add_argument("--max-num-seqs", type=int, default=64,
                   help="most sequences running at once")
    g.add_argument("--max-model-len", type=int, default=None,
                   help="most tokens a sequence holds, prompt and output (default: the model's "
                        "positions, as vLLM derives it; lowered, with a warning, to what the KV "
                        "budgets hold of one sequence)")
    g.add_argument("--max-num-batched-tokens", type=int, default=2048,
                   help="most tokens a step runs (decodes, then prefill chunks)")
    g.add_argument("--scheduling-policy", default="fcfs", choices=("fcfs", "priority"),
                   help="the order waiting requests are admitted in, as vLLM's: fcfs (default: "
                        "arrival) or priority (each request's priority, lower first, ties by "
                        "arrival; the server's requests then accept a non-zero priority). "
                        "Under priority a waiting request that does not fit preempts the "
                        "running request of the lowest priority below its own, which is "
                        "recomputed later (vLLM's)")
    g.add_argument("--cpu-threads", type=int, default=None, help="threads for CPU attention")
    g.add_argument("--enforce-eager", action="store_true",
                   help="launch every decode step eagerly, never as CUDA graphs (as vLLM's)")
    g.add_argument("--profile", default=None, help="hardware profile JSON (writescope calibrate)")
    g.add_argument("--tokenizer", default=None,
                   help="a folder whose tokenizer to use (default: the model's)")
    g.add_argument("--generation-config", default="auto",
                   help="the sampling defaults of requests that leave them out: auto (the "
                        "model's generation_config.json, as vLLM), vllm (none), or a folder")
    g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                   help="reuse the KV of prompt prefixes seen before (default: on; never with "
                        "--kv-policy migrate)")


def engine_kwargs(args: argparse.Namespace) -> dict:
    """The engine's keyword arguments from the flags, the cheap ones checked here: a bad policy
    name or byte size is an error at once, not after the weights have loaded."""
    from ..kvcache.placement import check_policy_name
    from ..units import check_byte_flags
    check_policy_name(args.kv_policy)
    check_byte_flags((("--vram-budget", args.vram_budget), ("--pinned-budget", args.pinned_budget),
                      ("--host-budget", args.host_budget),
                      ("--kv-cache-memory", getattr(args, "kv_cache_memory", None))))
    from ..units import parse_bytes
    if args.vram_budget is not None and parse_bytes(args.vram_budget) <= 0:
        raise ValueError(f"--vram-budget must be positive, got {args.vram_budget!r}")
    cpu_share = args.cpu_share
    if cpu_share is not None:  # a flag the policy does not read is an error, not ignored
        if args.kv_policy != "static":
            raise ValueError(f"--cpu-share is the static policy's share (--kv-policy static); "
                             f"--kv-policy {args.kv_policy} does not read it")
        if not 0.0 <= cpu_share <= 1.0:
            raise ValueError(f"--cpu-share must be in [0, 1], got {cpu_share}")
    check_profile(args.profile)
    kw = dict(model=args.model, dtype=args.dtype, device=args.device,
              random_weights=args.random_weights, seed=args.seed,
              vram_budget=args.vram_budget, pinned_budget=args.pinned_budget,
              host_budget=args.host_budget, num_gpu_blocks=args.num_gpu_blocks,
              kv_policy=args.kv_policy,
              cpu_share=0.5 if cpu_share is None else cpu_share, experts=args.experts,
              max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
              max_num_batched_tokens=args.max_num_batched_tokens, cpu_threads=args.cpu_threads,
              profile=args.profile, kv_cache_memory=getattr(args, "kv_cache_memory", None),
              enable_prefix_caching=getattr(args, "enable_prefix_caching", True),
              gpu_memory_utilization=getattr(args, "gpu_memory_utilization", None),
              enforce_eager=getattr(args, "enforce_eager", False),
              generation_config=getattr(args, "generation_config", "auto"),
              tokenizer=getattr(args, "tokenizer", None),
              scheduling_policy=getattr(args, "scheduling_policy", "fcfs"))
    if args.block_size is not None:
        kw["block_size"] = args.block_size
    return kw


def check_profile(profile: str | None) -> None:
    """The hardware profile ``--profile`` (else ``$WRITESCOPE_PROFILE``) names is read and
    checked now: a missing or broken file is the command's error naming where it came from,
    before the weights load (minutes), not after."""
    from ..planner.profile import HardwareProfile
    if profile is not None and not os.path.isfile(profile):
        raise ValueError(f"--profile: no file {profile!r} (`writescope calibrate --out "
                         "FILE` writes one)")
    path = profile or os.environ.get("WRITESCOPE_PROFILE")
    if path:
        try:
            HardwareProfile.load(path)
        except ValueError as e:
            raise ValueError(f"{'--profile' if profile else '$WRITESCOPE_PROFILE'}: {e}") from None


def placement_summary(engine) -> str:
    """One line, once the engine is built: where the routed experts run and what each KV region
    may hold (what --experts, --vram-budget and --kv-cache-memory decided)."""
    from ..kvcache.regions import Region
    from ..units import format_bytes
    n_moe = len(engine.config.moe_layers)
    n_cpu = sum(engine.cpu_expert_layers)
    # on a machine without a GPU the "device" regions and weights live in ordinary memory
    dev = "GPU" if engine.device.type == "cuda" else f"device ({engine.device.type})"
    experts = ("no routed experts" if not n_moe else f"routed experts on the {dev}" if not n_cpu
               else "routed experts on the CPU" if n_cpu == n_moe
               else f"routed experts on the CPU in {n_cpu} of {n_moe} MoE layers")
    by = engine.cache.layout.bytes(engine.cache.spec)
    n = engine.cache.layout.num_blocks
    if engine.experts_moved_layers:
        experts += (f" ({engine.experts_moved_layers} of them moved there once the activations "
                    "were measured)")
    if engine.kv_split is not None:
        experts += (f" (--kv-cache-memory auto: chosen for {engine.scheduler.max_num_seqs} x "
                    f"{engine.max_model_len} tokens, {engine.kv_split['step_s'] * 1e3:.1f} ms a "
                    "step predicted)")
    return (f"{experts} | weights on the {dev} {format_bytes(engine.weights_bytes)} of "
            f"{format_bytes(engine.vram_budget)}, activations "
            f"{format_bytes(engine.activation_bytes + engine.buffer_bytes)} | KV: G {n[Region.G]} blk/"
            f"{format_bytes(by[Region.G])}, W {n[Region.W]} tails/{format_bytes(by[Region.W])}, "
            f"T {n[Region.T]} blk/{format_bytes(by[Region.T])} pinned, C {n[Region.C]} blk/"
            f"{format_bytes(by[Region.C])} host")


def kv_summary(stats: dict) -> str:
    """One line: where the KV lived, the CPU share of attention, bytes moved after placement."""
    from ..units import format_bytes
    parts = []
    for r in "GTCW":
        w = stats.get(f"kv.bytes_written.{r}", 0)
        parts.append(f"{r} {stats.get(f'kv.peak_blocks.{r}', stats.get(f'kv.blocks.{r}', 0))} blk/"
                     f"{format_bytes(w)}")
    return (f"KV: {', '.join(parts)} written | CPU share of attention reads "
            f"{stats.get('kv.cpu_share_of_reads', 0.0):.0%} | moved after placement "
            f"{format_bytes(stats.get('kv.bytes_moved_after_placement', 0))}")


def check_writable(flag: str, value, folder, make: bool = False) -> None:
    """``folder`` (where ``flag``'s ``value`` puts files; made first when ``make``) takes a new
    file: a read-only place is the command's error naming the flag, before any work."""
    import tempfile
    from pathlib import Path
    try:
        if make:
            Path(folder).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise ValueError(f"{flag} {value}: cannot write there ({e.strerror or e})") from None
