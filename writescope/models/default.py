"""The built-in default model: a small Qwen3-MoE checkpoint built deterministically on first use.

``writescope generate`` with no ``--model`` (and ``LLM()`` with no model) runs this model, so the
command works offline on a fresh machine. It is a real Hugging Face checkpoint folder:

- ``config.json``: hub-style qwen3_moe config (4 layers, hidden 256, 8 experts top-2,
  4 query heads over 2 KV heads of head_dim 64, vocab = the tokenizer's size);
- ``model.safetensors``: bfloat16 weights drawn from a seeded ``torch.Generator`` with the hub's
  tensor names (per-expert ``mlp.experts.{e}.{gate,up,down}_proj.weight``);
- ``generation_config.json``;
- ``tokenizer.json`` + ``tokenizer_config.json``: a byte-level BPE trained with the ``tokenizers``
  library on the small English text in :mod:`writescope.models.default_corpus`, ChatML special
  tokens and a ChatML Jinja chat template.

The weights are random apart from one cheap trick: the embedding and LM head are chosen so that the
model's output starts as a bigram model of the training text (the decoder layers, initialised like
the model's ``initializer_range``, only perturb it). It therefore produces English-looking word
salad instead of uniformly random tokens. Nothing else about the model is special; it goes through
the same loader and engine as any other checkpoint.

Every file is byte-identical from build to build on a machine (fixed seeds, sorted JSON, no
timestamps, no library versions in the files). The folder is created atomically: built in a
temporary sibling and renamed into place, so two processes racing on first use both end with the
same complete folder.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from .default_corpus import CORPUS

DEFAULT_MODEL_VERSION = 1
DEFAULT_MODEL_NAME = f"default-moe-v{DEFAULT_MODEL_VERSION}"
SEED = 1234

#: special tokens (ids 0, 1, 2 in this order)
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)

#: ChatML (as used by Qwen); message content may be a string or a list of OpenAI-style parts
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- elif message['content'] is not none -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

TOKENIZER_VOCAB = 1024
HIDDEN = 256
LAYERS = 4
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 64
EXPERTS = 8
TOP_K = 2
MOE_INTERMEDIATE = 256
MAX_POSITIONS = 4096
INIT_STD = 0.02
BIGRAM_SMOOTHING = 0.01
BIGRAM_TEMPERATURE = 4.0


# ---------------------------------------------------------------------------------- locations
def cache_root() -> Path:
    """``$WRITESCOPE_CACHE``, else ``$XDG_CACHE_HOME/writescope``, else ``~/.cache/writescope``."""
    env = os.environ.get("WRITESCOPE_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "writescope"


def default_model_path() -> Path:
    """The default model's checkpoint folder, building it on first use (about a second)."""
    root = cache_root()
    final = root / DEFAULT_MODEL_NAME
    if (final / "config.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{DEFAULT_MODEL_NAME}.tmp-", dir=root))
    try:
        build_default_model(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        try:
            os.rename(tmp, final)  # atomic; fails if another process got there first
        except OSError:
            if not (final / "config.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


# ---------------------------------------------------------------------------------- tokenizer
def train_tokenizer(vocab_size: int = TOKENIZER_VOCAB):
    """A byte-level BPE (GPT-2 pre-tokenisation) trained on the embedded corpus.

    Returns a ``tokenizers.Tokenizer`` of exactly ``vocab_size`` tokens (special tokens and the 256
    byte symbols included). Training is deterministic (the trainer breaks count ties by pair).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"a byte-level BPE needs at least {256 + len(SPECIAL_TOKENS)} tokens")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=1, show_progress=False,
        special_tokens=list(SPECIAL_TOKENS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS.split("\n\n"), trainer=trainer)
    if tok.get_vocab_size() != vocab_size:  # the corpus ran out of pairs to merge
        raise ValueError(f"the embedded corpus yields only {tok.get_vocab_size()} tokens, "
                         f"not {vocab_size}")
    return tok


def write_tokenizer_files(dst: str | Path, vocab_size: int = TOKENIZER_VOCAB,
                          model_max_length: int = MAX_POSITIONS) -> int:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``dst``; return the vocab size."""
    tok = train_tokenizer(vocab_size)
    _save_tokenizer(tok, Path(dst), model_max_length)
    return tok.get_vocab_size()


def _save_tokenizer(tok, dst: Path, model_max_length: int) -> None:
    (dst / "tokenizer.json").write_text(tok.to_str(pretty=True) + "\n", encoding="utf-8")
    added = {str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False,
                                       "rstrip": False, "single_word": False, "special": True}
             for t in SPECIAL_TOKENS}
    tcfg = {
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "model_max_length": model_max_length,
        "pad_token": ENDOFTEXT,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }
    _write_json(dst / "tokenizer_config.json", tcfg)


# ---------------------------------------------------------------------------------- model
def default_config(vocab_size: int, bos: int, eos: int) -> dict:
    """Hub-style config.json (the keys Qwen/Qwen3-30B-A3B publishes), scaled down."""
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos,
        "decoder_sparse_step": 1,
        "eos_token_id": eos,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": INIT_STD,
        "intermediate_size": 2 * HIDDEN,
        "max_position_embeddings": MAX_POSITIONS,
        "max_window_layers": LAYERS,
        "mlp_only_layers": [],
        "model_type": "qwen3_moe",
        "moe_intermediate_size": MOE_INTERMEDIATE,
        "norm_topk_prob": True,
        "num_attention_heads": HEADS,
        "num_experts": EXPERTS,
        "num_experts_per_tok": TOP_K,
        "num_hidden_layers": LAYERS,
        "num_key_value_heads": KV_HEADS,
        "output_router_logits": False,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.001,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": vocab_size,
    }


def _bigram_targets(tok, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(contexts seen in the corpus, centred log P(next | context) for them), float64.

    P is the corpus bigram distribution with add-``BIGRAM_SMOOTHING`` smoothing."""
    eot = tok.token_to_id(ENDOFTEXT)
    pairs: list[int] = []
    for para in CORPUS.split("\n\n"):
        ids = tok.encode(para.replace("\n", " ").strip()).ids + [eot]
        pairs += [a * vocab + b for a, b in zip(ids[:-1], ids[1:])]
    counts = torch.bincount(torch.tensor(pairs), minlength=vocab * vocab)
    counts = counts.to(torch.float64).view(vocab, vocab)
    seen = (counts.sum(1) > 0).nonzero().flatten()
    c = counts[seen] + BIGRAM_SMOOTHING
    logp = (c / c.sum(1, keepdim=True)).log()
    return seen, logp - logp.mean(1, keepdim=True)


def default_state_dict(tok, vocab: int) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors (hub names), from one seeded generator in a fixed order."""
    g = torch.Generator().manual_seed(SEED)

    def normal(*shape: int, std: float = INIT_STD, dtype=torch.float32) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=dtype).mul_(std)

    sd: dict[str, torch.Tensor] = {}
    # Embedding rows of RMS 1 dominate the residual stream (the layers add terms ~0.1 of that),
    # so the final RMSNorm sees roughly the token's own embedding. The LM head is a ridge
    # regression of the corpus's centred log-bigram matrix on those embeddings (seen contexts
    # only: 600-odd rows against 256 columns, a well-conditioned float64 solve, so rounding to
    # bfloat16 gives the same bytes on any machine), scaled up by BIGRAM_TEMPERATURE because the
    # regression shrinks the logits. The result predicts the corpus at ~2.3 nats/token against
    # ln(1024) = 6.9 for uniform: word salad made of real words.
    emb = normal(vocab, HIDDEN, std=1.0, dtype=torch.float64)
    emb = emb * torch.rsqrt(emb.pow(2).mean(-1, keepdim=True))
    seen, target = _bigram_targets(tok, vocab)
    x = emb[seen]
    gram = x.T @ x + torch.eye(HIDDEN, dtype=torch.float64)
    head = torch.linalg.solve(gram, x.T @ target).T * BIGRAM_TEMPERATURE  # [vocab, HIDDEN]
    sd["model.embed_tokens.weight"] = emb
    q_out, kv_out = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = torch.ones(HIDDEN)
        sd[p + "post_attention_layernorm.weight"] = torch.ones(HIDDEN)
        sd[p + "self_attn.q_proj.weight"] = normal(q_out, HIDDEN)
        sd[p + "self_attn.k_proj.weight"] = normal(kv_out, HIDDEN)
        sd[p + "self_attn.v_proj.weight"] = normal(kv_out, HIDDEN)
        sd[p + "self_attn.o_proj.weight"] = normal(HIDDEN, q_out)
        sd[p + "self_attn.q_norm.weight"] = torch.ones(HEAD_DIM)
        sd[p + "self_attn.k_norm.weight"] = torch.ones(HEAD_DIM)
        sd[p + "mlp.gate.weight"] = normal(EXPERTS, HIDDEN)
        for e in range(EXPERTS):
            pe = f"{p}mlp.experts.{e}."
            sd[pe + "gate_proj.weight"] = normal(MOE_INTERMEDIATE, HIDDEN)
            sd[pe + "up_proj.weight"] = normal(MOE_INTERMEDIATE, HIDDEN)
            sd[pe + "down_proj.weight"] = normal(HIDDEN, MOE_INTERMEDIATE)
    sd["model.norm.weight"] = torch.ones(HIDDEN)
    sd["lm_head.weight"] = head
    return {k: v.to(torch.bfloat16).contiguous() for k, v in sd.items()}


def build_default_model(dst: str | Path) -> Path:
    """Write the whole default checkpoint into the (existing, empty) folder ``dst``."""
    from safetensors.torch import save_file

    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(TOKENIZER_VOCAB)
    _save_tokenizer(tok, dst, MAX_POSITIONS)
    vocab = tok.get_vocab_size()
    eot, im_end = tok.token_to_id(ENDOFTEXT), tok.token_to_id(IM_END)
    _write_json(dst / "config.json", default_config(vocab, bos=eot, eos=im_end))
    _write_json(dst / "generation_config.json", {
        "bos_token_id": eot,
        "eos_token_id": [im_end, eot],
        "pad_token_id": eot,
    })
    save_file(default_state_dict(tok, vocab), str(dst / "model.safetensors"),
              metadata={"format": "pt"})
    return dst


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
                    encoding="utf-8")
