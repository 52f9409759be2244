"""``writescope generate``: run prompts through the engine and print or save the results."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from .common import (add_engine_args, check_writable, engine_kwargs, kv_summary,
                     placement_summary)


def register(sub) -> None:
    p = sub.add_parser("generate", help="generate text for one prompt or a JSONL file of prompts",
                       description="Generate text. With no --model the embedded default model is used.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the prompt text")
    src.add_argument("--prompts-file", metavar="FILE",
                     help='JSONL: one {"prompt": "..."} (or a plain string) per line; '
                          '"-" reads standard input')
    p.add_argument("--chat", action="store_true", help="wrap prompts in the model's chat template")
    p.add_argument("--chat-template-kwargs", type=_template_kwargs, default=None, metavar="JSON",
                   help='variables the chat template reads, as a JSON object (with --chat), '
                        'e.g. \'{"enable_thinking": false}\' for Qwen3')
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1, help="sample from the K most likely tokens (-1: all)")
    p.add_argument("--min-p", type=float, default=0.0,
                   help="tokens less likely than this times the most likely one are not sampled")
    p.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="transformers' repetition penalty over prompt and output (1: off)")
    p.add_argument("--presence-penalty", type=float, default=0.0)
    p.add_argument("--frequency-penalty", type=float, default=0.0)
    p.add_argument("--stop", nargs="+", metavar="TEXT", default=None,
                   help="the output ends before the first of these strings")
    p.add_argument("--ignore-eos", action="store_true",
                   help="go on past end-of-sequence tokens (up to --max-tokens)")
    p.add_argument("--min-tokens", type=int, default=0,
                   help="EOS, stop tokens and --stop strings cannot end the output within "
                        "this many tokens")
    p.add_argument("--logprobs", type=int, metavar="K",
                   help="each generated token's log-probability and the K most likely tokens' "
                        "(0: the sampled token's only); printed after each text, or in --output")
    so = p.add_argument_group("structured outputs (one of)").add_mutually_exclusive_group()
    so.add_argument("--json-schema", metavar="SCHEMA",
                    help="the output is JSON matching this schema (a file, or the schema's JSON)")
    so.add_argument("--json-object", action="store_true", help="the output is a JSON object")
    so.add_argument("--regex", help="the output matches this regular expression")
    so.add_argument("--choice", nargs="+", metavar="TEXT", help="the output is one of these")
    so.add_argument("--grammar", metavar="GRAMMAR",
                    help="the output follows this Lark or GBNF grammar (a file, or its text)")
    p.add_argument("--output", help="write results as JSONL here")
    add_engine_args(p)
    p.set_defaults(func=run)


def _read_prompts(path: str) -> list:
    if path == "-":  # standard input (a pipe, a here-document), read to its end
        if sys.stdin.isatty():
            print("reading JSONL prompts from the terminal; end with Ctrl-D", file=sys.stderr)
        return _parse_prompts(sys.stdin, "<stdin>")
    with open(path) as f:
        return _parse_prompts(f, path)


def _parse_prompts(lines, path: str) -> list:
    prompts = []
    for i, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{i}: not valid JSON ({e})") from None
        if isinstance(obj, dict):
            obj = obj.get("prompt", obj.get("prompt_token_ids"))
        if not isinstance(obj, (str, list)):
            raise ValueError(f'{path}:{i}: expected a string or {{"prompt": ...}}')
        prompts.append(obj)
    if not prompts:
        raise ValueError(f"{path} holds no prompts")
    return prompts


def _file_or_text(v: str) -> str:
    if os.path.isfile(v):
        with open(v) as f:
            return f.read()
    return v


def _template_kwargs(text: str) -> dict:
    try:
        v = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e})") from None
    if not isinstance(v, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return v


def structured_outputs(args: argparse.Namespace):
    """The constraint the flags ask for, or None."""
    from ..core import InvalidRequestError, StructuredOutputsParams

    if args.json_schema is not None:
        text = _file_or_text(args.json_schema)
        try:
            schema = json.loads(text)
        except json.JSONDecodeError as e:
            v = args.json_schema
            if os.path.isfile(v):
                raise InvalidRequestError(f"--json-schema: the file is not valid JSON ({e})") from None
            if not v.lstrip().startswith(("{", "[", '"')):  # a path, most likely
                raise InvalidRequestError(f"--json-schema: no file {v!r}, and the text is not "
                                          "a JSON schema") from None
            raise InvalidRequestError(f"--json-schema: it is not valid JSON ({e})") from None
        return StructuredOutputsParams(json=schema)
    if args.json_object:
        return StructuredOutputsParams(json_object=True)
    if args.regex is not None:
        return StructuredOutputsParams(regex=args.regex)
    if args.choice is not None:
        return StructuredOutputsParams(choice=args.choice)
    if args.grammar is not None:
        return StructuredOutputsParams(grammar=_file_or_text(args.grammar))
    return None


def logprob_table(o, tokenizer) -> str:
    """One line per generated token: its text, its log-probability and the alternatives."""
    lines = []
    tops = o.top_logprobs or [None] * len(o.token_ids)
    for i, (t, lp, top) in enumerate(zip(o.token_ids, o.logprobs, tops)):
        line = f"{i:5d} {tokenizer.decode([t])!r:>16} {lp:9.4f}"
        if top:
            line += "  | " + "  ".join(f"{tokenizer.decode([a])!r} {v:.4f}" for a, v in top.items())
        lines.append(line)
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from ..core import SamplingParams
    from ..llm import LLM

    prompts = [args.prompt] if args.prompt is not None else _read_prompts(args.prompts_file)
    if args.prompt == "" and not args.chat:
        raise ValueError("the prompt is empty")
    # checked before the model loads: a bad flag is an error at once, not after the weights
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            min_p=args.min_p, stop=args.stop, ignore_eos=args.ignore_eos,
                            max_tokens=args.max_tokens, seed=args.seed, logprobs=args.logprobs,
                            repetition_penalty=args.repetition_penalty,
                            presence_penalty=args.presence_penalty,
                            frequency_penalty=args.frequency_penalty, min_tokens=args.min_tokens,
                            structured_outputs=structured_outputs(args))
    if params.structured_outputs is not None:
        from ..layers.grammar import check
        check(params.structured_outputs)
    if args.chat_template_kwargs is not None and not args.chat:
        raise ValueError("--chat-template-kwargs needs --chat")
    if args.output:  # a path that cannot be written fails now, not after the generation
        out_path = Path(args.output)
        if out_path.is_dir():
            raise ValueError(f"--output {args.output} is a folder")
        if not out_path.parent.is_dir():
            raise ValueError(f"--output {args.output}: no folder {out_path.parent}")
        # a folder this process cannot create files in (read-only, /proc, ...)
        check_writable("--output", args.output, out_path.parent)
        if out_path.exists() and not os.access(out_path, os.W_OK):
            raise ValueError(f"--output {args.output}: cannot write there (not writable)")
    if args.chat:  # refused before the weights load; a template renders text only
        for i, p in enumerate(prompts):
            if not isinstance(p, str):
                raise ValueError(f"--chat renders text prompts with the chat template; prompt "
                                 f"{i + 1} is token ids (drop --chat to send them as they are)")
    # each prompt its own seed (vLLM's --seed seeds one generator that every request draws
    # from): the same seed for all would sample the same text for equal prompts
    params = [dataclasses.replace(params, seed=(args.seed + i * params.n) % 2 ** 63)
              for i in range(len(prompts))]
    llm = LLM(**engine_kwargs(args), show_progress=True)
    print(placement_summary(llm.engine), file=sys.stderr)
    if args.chat:
        prompts = [llm.tokenizer.apply_chat_template([{"role": "user", "content": p}],
                                                     **(args.chat_template_kwargs or {}))
                   for p in prompts]
    t0 = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=True)
    dt = time.perf_counter() - t0
    n_tok = sum(len(o.token_ids) for o in outputs)
    out_f = open(args.output, "w") if args.output else None
    for o in outputs:
        if out_f:
            row = {"prompt": o.prompt, "prompt_token_ids": o.prompt_token_ids, "text": o.text,
                   "token_ids": o.token_ids, "finish_reason": o.finish_reason}
            if o.logprobs is not None:
                row["logprobs"] = o.logprobs
            if o.top_logprobs is not None:  # per token [[id, log-probability], ...]
                row["top_logprobs"] = [[[t, v] for t, v in d.items()] for d in o.top_logprobs]
            out_f.write(json.dumps(row) + "\n")
        else:
            print(o.text)
            if o.logprobs is not None:
                print(logprob_table(o, llm.tokenizer))
    if out_f:
        out_f.close()
        print(f"wrote {len(outputs)} results to {args.output}", file=sys.stderr)
    stats = llm.stats()
    print(f"{len(outputs)} requests, {n_tok} tokens in {dt:.2f} s: {n_tok / dt:.1f} tokens/s",
          file=sys.stderr)
    print(kv_summary(stats), file=sys.stderr)
    return 0
