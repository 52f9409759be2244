"""The WriteScope roofline: a decode step's time from measured ceilings, as pure functions.

Everything here is arithmetic on a :class:`~writescope.planner.profile.HardwareProfile`, a
:class:`~writescope.models.config.ModelConfig` and a :class:`StepLoad` (who reads how many KV
tokens this step). No tensors, no clocks, no state: the planner, ``writescope plan`` and the
tests all call the same functions.

One decode layer, for a batch of ``B`` sequences (one new token each)::

    GPU   |dense (attn projections, norms, router, shared experts) | attention over G/W + staged T |
    CPU   |                                                        | round trip + attention over C |  routed experts (when on the CPU) |
    PCIe  |  H2D of the next layer's T blocks (prefetched: overlaps this whole layer)          |

* ``gpu_attn  = (resident + streamed) tokens x kv_bytes / gpu attention rate``
* ``cpu_attn  = round trip + cpu tokens x kv_bytes / cpu attention rate``  (0 with no CPU tokens)
* ``compute   = dense + max(gpu_attn, cpu_attn) + routed experts``  (experts need the attention
  output, so they follow it; on the GPU they read their weights from HBM, on the CPU at the CPU
  expert rate)
* ``pcie      = streamed tokens x kv_bytes / H2D rate``
* ``layer     = max(compute, pcie)``: the staging ring copies layer l+1 while layer l computes,
  so streaming costs nothing until it is the slower of the two;
* ``step      = sum(layer) + pcie of the first layer`` (nothing hides the first copy) ``+ lm head``.
* ``dense`` holds ``KERNELS_PER_LAYER`` launches: eager ones (``launch_s``), or, in a step whose
  KV is all on the GPU (the engine replays such steps as CUDA graphs, ``engine/graphs.py``, CPU
  experts' calls included unless they are not graphed: ``layers/cpu_experts_graph.py``), a
  graph's kernels (``graph_launch_s``, where the profile has it).

Contention: the CPU's reads and the H2D DMA share host DRAM. When the CPU is busy (attention or
experts) while T streams, the H2D rate is the profile's *concurrent* H2D rate, and the CPU
attention rate is capped at the concurrent CPU read rate. The CPU experts read at that cap for
as long as the link streams and at their own rate after it (:func:`_beside_the_link`). On a machine without a GPU the
"device" side is the same CPU (the portable torch path over G/T blocks): nothing overlaps and
nothing crosses a bus, so ``compute = dense + gpu_attn + cpu_attn + experts`` and pcie = 0.

The CPU share ``x`` is the fraction of *spilled* tokens (T and C blocks) the CPU attends.
Inside ``(0, 1)`` every term is linear in ``x``, or piecewise linear: with T blocks read by the
CPU at their own rate, and where the link's time passes the CPU experts' (they read at the cap
throughout beyond it). Step time is then a piecewise-linear function of ``x``, not always
convex; :func:`optimal_cpu_share` evaluates it at every kink, at every crossing of two lines
between kinks, and at the two ends (where the fixed costs and the contention switch on or off),
and keeps the smallest best ``x``; the CPU
starts attending only for a predicted gain of at least ``MIN_GAIN`` (1 %) of the step, and the
placement target (:func:`target_share`, blocks written to C for good) only for
``PLACEMENT_MIN_GAIN`` (3 %). For short
sequences the round trip outweighs what the CPU could take off the PCIe link and ``x = 0``;
for long ones the optimum balances ``x*S/B_cpu`` against ``(1-x)*S/B_pcie`` and tends to the
bandwidth ratio ``B_cpu / (B_cpu + B_pcie)``.

Where the routed experts run (``experts_on_cpu`` below) is ``True`` (every MoE layer's on the
CPU), ``False`` (all on the GPU) or one flag per layer (``experts="auto"`` puts some layers'
experts on the CPU and keeps the others on the GPU: :func:`cpu_expert_layers`); each MoE layer
is then timed where its own experts run, and the step as a whole is the engine's step with CPU
experts (the CPU's plain round trip, graph launches only in resident steps whose CPU expert
calls are graphed). A step with CPU experts split into two sub-batches
(``WRITESCOPE_PIPELINE_EXPERTS``, ``pipelined=True``; the engine splits only steps whose KV is
all in HBM, so that they stay graphs) is timed as a whole instead (:func:`_split_experts_step`):
each sub-batch's layers at its own load, the GPU's work and the CPU's summed over both, the step
the longer of the two plus the lead and tail the other side cannot hide; under
``pipelined="auto"`` (that variable's default: the runner measures both forms and keeps the
faster) as the faster of its two forms (:data:`Pipelined`).

Online feedback (:mod:`writescope.planner.feedback`) multiplies the CPU attention, PCIe, GPU
attention and CPU expert terms by :class:`Corrections` (measured over predicted, smoothed); the
CPU attention's per-layer round trip and its per-byte term may get separate factors.

The layer pipeline follows the designs of NEO (CPU attention overlapped with GPU work, load
split from a per-layer cost model) and FlexGen/KTransformers (prefetching the next layer's
offloaded data during this layer's compute, routed experts on the CPU); the model is ours.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence, Union

if TYPE_CHECKING:  # pragma: no cover
    from ..models.config import ModelConfig
    from .profile import HardwareProfile

WEIGHT_BYTES = 2  # bf16 weights

#: where the routed experts run: every MoE layer's on the CPU (True), none (False), or a flag
#: per layer (the engine's ``cpu_expert_layers``; a frozenset of layer indices is taken too)
ExpertsOnCpu = Union[bool, Sequence[bool], frozenset]


def cpu_expert_layers(cfg: "ModelConfig", experts_on_cpu: ExpertsOnCpu) -> frozenset:
    """The MoE layers whose routed experts run on the CPU, from a bool (all or none), one flag
    per layer, or a frozenset of layer indices (returned as it is)."""
    if isinstance(experts_on_cpu, frozenset):
        return experts_on_cpu
    moe = _facts(cfg)["moe_layers"]
    if isinstance(experts_on_cpu, (bool, int)) or not hasattr(experts_on_cpu, "__iter__"):
        return moe if experts_on_cpu else frozenset()  # (numpy's bools too)
    flags = tuple(experts_on_cpu)
    if len(flags) != cfg.num_layers:
        raise ValueError(f"experts_on_cpu has {len(flags)} flags, the model has "
                         f"{cfg.num_layers} layers")
    return _flagged_layers(moe, flags)  # (the flags as given: numpy's bools hash as bools)


@functools.lru_cache(maxsize=256)
def _flagged_layers(moe: frozenset, flags: tuple) -> frozenset:
    """The MoE layers among ``flags``' set ones (asked several times a prediction, each
    prediction of a step with per-layer flags)."""
    return frozenset(i for i, f in enumerate(flags) if f and i in moe)


def expert_weight_bytes(cfg: "ModelConfig", experts_on_cpu: bool = False) -> float:
    """Bytes a routed-expert weight takes where the experts run: bf16, except FP8 checkpoints'
    experts, which stay FP8 on either side in a bf16 run (one byte and their blocks' scales:
    ``layers/cpu_experts.py`` in host memory, ``layers/moe.py`` on the GPU)."""
    q = getattr(cfg, "quantization", None)
    if q is not None:
        return q.bytes_per_weight
    return WEIGHT_BYTES
KV_ITEMSIZE = 2   # bf16 KV
#: torch kernels launched per layer outside attention (projections, norms, rotary, router, ...):
#: the fixed GPU cost of a layer is this many launches
KERNELS_PER_LAYER = 24
#: the smallest predicted gain (fraction of the step) for which the CPU starts attending
MIN_GAIN = 0.01
#: the smallest predicted gain for which placement starts writing blocks to C, where they stay:
#: the bench resolves ~3% between policies, and the model errs by as much (DeepSeek-V2-Lite
#: 8 x 128K with the experts on the CPU: the model gave a share of 0.19 a 1.3% gain, and the C
#: blocks placed for it made writescope 4-10% slower than transfer; 2026-12-01d calls 3-4)
PLACEMENT_MIN_GAIN = 0.03
#: a pipelined decode step (two interleaved sub-batches, ``engine/graphs.pipelined_pieces``)
#: runs each layer's dense work and routed experts once per sub-batch: this many times the
#: one-batch GPU time (weights read twice, launches doubled). An estimate, to be measured
PIPE_GPU_FACTOR = 1.5


#: The form of a decode step (``pipelined`` below). ``False``: one batch. ``True``: two
#: interleaved sub-batches, whatever the step (the form the runner gave a step; with
#: ``WRITESCOPE_PIPELINE=1`` those with CPU attention). ``"on"``: what
#: ``WRITESCOPE_PIPELINE_EXPERTS=1`` splits -- steps of two or more sequences with routed
#: experts on the CPU and all KV in HBM -- and every other step whole. ``"auto"`` (that
#: variable's default): those steps in the faster of the two forms, as the runner measures
#: them (``engine/stepform.py``).
Pipelined = Union[bool, str]
EXPERT_FORMS = ("on", "auto")


def expert_form(mode: str) -> Pipelined:
    """The :data:`Pipelined` form that ``WRITESCOPE_PIPELINE_EXPERTS``'s ``mode``
    (``kvcache.subbatches.expert_pipeline_mode``) gives the planner: ``all`` also splits steps
    with spilled KV, which the model times whole anyway (their CPU attention and experts share
    the cores)."""
    return {"on": "on", "all": "on", "auto": "auto"}.get(mode, False)


# ----------------------------------------------------------------------------- inputs
@dataclass(frozen=True)
class StepLoad:
    """KV tokens one decode step reads in each layer, summed over the batch, by who reads them."""

    batch_size: int
    resident_tokens: float      # G blocks + W tails: the GPU reads them in place
    streamed_tokens: float      # T blocks the GPU attends after an H2D copy
    cpu_c_tokens: float         # C blocks: the CPU reads them in place
    cpu_t_tokens: float = 0.0   # T blocks the CPU reads in place (no copy)

    @property
    def spilled_tokens(self) -> float:
        return self.streamed_tokens + self.cpu_c_tokens + self.cpu_t_tokens

    @property
    def cpu_tokens(self) -> float:
        return self.cpu_c_tokens + self.cpu_t_tokens

    @property
    def cpu_share(self) -> float:
        s = self.spilled_tokens
        return self.cpu_tokens / s if s > 0 else 0.0


@dataclass(frozen=True)
class Corrections:
    """Measured/predicted ratios the feedback learned (1 = the profile is right)."""

    cpu: float = 1.0     # CPU attention: its per-byte term (and its round trip, see cpu_fixed)
    pcie: float = 1.0    # H2D streaming
    gpu: float = 1.0     # GPU attention
    expert: float = 1.0  # routed experts on the CPU
    cpu_fixed: float | None = None  # CPU attention's per-layer round trip (None: ``cpu``)


@dataclass(frozen=True)
class LayerTime:
    dense_s: float       # GPU work outside attention and routed experts (weights + launches)
    gpu_attn_s: float
    cpu_attn_s: float
    expert_s: float      # routed experts (GPU or CPU, wherever they run)
    pcie_s: float
    compute_s: float
    total_s: float       # max(compute, pcie)
    pipelined: bool = False  # two sub-batches: CPU attention overlaps the other's GPU work
    #: the link time from which the CPU experts read at the capped rate throughout (their term
    #: is linear in the link time below it and constant above: a kink the optimiser visits)
    expert_knee_s: float = math.inf


@dataclass(frozen=True)
class StepPrediction:
    step_s: float
    gpu_attn_s: float    # summed over layers, like the engine's measured ``gpu_s``
    cpu_attn_s: float    # like ``cpu_s``
    pcie_s: float        # like ``pcie_s``
    expert_s: float
    dense_s: float
    cpu_share: float
    layers: tuple[LayerTime, ...] = field(repr=False, default=())
    #: the routed experts' seconds of the layers whose experts run on the CPU (``expert_s``
    #: less the GPU layers' HBM reads), like the engine's measured ``cpu_expert_s``
    cpu_expert_s: float = 0.0
    #: a step timed as a whole (:func:`_split_experts_step`, whose KV is all in HBM, so no
    #: CPU share to optimise): the pieces whose max (plus the LM head) is the step. Empty: the
    #: step is the sum of its layers.
    lines: tuple[float, ...] = ()


# ----------------------------------------------------------------------------- model facts
def kv_bytes_per_token_layer(cfg: "ModelConfig") -> float:
    """Bytes one token's KV takes in one layer (bf16)."""
    if cfg.is_mla:
        return (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * KV_ITEMSIZE
    return cfg.num_kv_heads * 2 * cfg.head_dim * KV_ITEMSIZE


def attn_family(cfg: "ModelConfig") -> str:
    """The CPU attention kernel's shape family: what sets its speed per KV byte."""
    if cfg.is_mla:
        return family_key(True, cfg.num_heads, 1, cfg.kv_lora_rank + cfg.qk_rope_head_dim)
    return family_key(False, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)


def family_key(mla: bool, num_heads: int, num_kv_heads: int, dim: int) -> str:
    """:func:`attn_family`'s key from the shape alone: query heads, KV heads and the record
    (MLA: latent plus rope) or head dimension."""
    if mla:
        return f"mla-h{num_heads}-r{dim}"
    return f"gqa-g{num_heads // num_kv_heads}-d{dim}"


def active_experts(num_experts: int, top_k: int, tokens: int) -> float:
    """Expected distinct experts hit by ``tokens`` tokens routing to ``top_k`` each (uniform)."""
    if num_experts <= 0 or tokens <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def layer_param_counts(cfg: "ModelConfig", layer: int) -> dict[str, int]:
    """Parameters of one decoder layer: ``attn`` (with norms), ``mlp`` (dense MLP, or router and
    shared experts of an MoE layer) and ``expert`` (one routed expert; 0 in a dense layer)."""
    facts = _facts(cfg)
    return dict(facts["moe" if layer in facts["moe_layers"] else "dense"])


_FACTS: dict[int, tuple["ModelConfig", dict]] = {}


def _facts(cfg: "ModelConfig") -> dict:
    """Per-config constants, computed once (the planner asks for them every step)."""
    hit = _FACTS.get(id(cfg))
    if hit is not None and hit[0] is cfg:
        return hit[1]
    h = cfg.hidden_size
    pc = cfg.param_counts()
    moe_layers = frozenset(cfg.moe_layers)
    n_moe, n_dense = len(moe_layers), cfg.num_layers - len(moe_layers)
    shared = 3 * h * cfg.shared_expert_intermediate_size + h * cfg.num_experts
    dense = 3 * h * cfg.intermediate_size
    embed = cfg.vocab_size * h * (1 if cfg.tie_word_embeddings else 2)
    attn = (pc["other"] - embed - h - n_moe * shared - n_dense * dense) // cfg.num_layers
    facts = {"moe_layers": moe_layers,
             "moe": {"attn": attn, "mlp": shared, "expert": pc["expert"]},
             "dense": {"attn": attn, "mlp": dense, "expert": 0}}
    if len(_FACTS) > 64:
        _FACTS.clear()
    _FACTS[id(cfg)] = (cfg, facts)
    return facts


def gpu_weight_bytes(cfg: "ModelConfig", experts_on_cpu: ExpertsOnCpu) -> int:
    """Weight bytes resident on the GPU (everything, less the routed experts of the layers
    whose experts are on the CPU)."""
    pc = cfg.param_counts()
    n_moe = len(_facts(cfg)["moe_layers"])
    on_gpu = n_moe - len(cpu_expert_layers(cfg, experts_on_cpu))
    experts = pc["routed_experts"] * expert_weight_bytes(cfg) * on_gpu / n_moe if n_moe else 0
    return int(WEIGHT_BYTES * pc["other"] + experts)


# ----------------------------------------------------------------------------- the model
def _concurrent(profile: "HardwareProfile", cpu_busy: bool, streaming: bool) -> tuple[float, float]:
    """(H2D rate, cap on CPU read rate) given what runs at the same time."""
    if not profile.has_gpu:
        return float("inf"), float("inf")
    h2d = profile.concurrent_h2d_Bps if cpu_busy and profile.concurrent_h2d_Bps else profile.h2d_pinned_Bps
    cap = (profile.concurrent_cpu_read_Bps if streaming and profile.concurrent_cpu_read_Bps
           else float("inf"))
    return h2d, cap


def link_expert_share(profile: "HardwareProfile", batch_size: int) -> float:
    """The link's share of the CPU experts' bytes in a decode step of ``batch_size`` tokens
    that streams no KV (``layers/expert_link.py``: its setting, the profile's rates), 0 where
    it takes none. (As a fraction of bytes: the engine gives it whole experts, the count that
    comes nearest.)"""
    if not profile.has_gpu:
        return 0.0
    from ..layers import expert_link
    return expert_link.planned_share(profile, batch_size)


def _beside_the_link(nbytes: float, rate: float, cap: float, link_s: float) -> float:
    """Seconds to read ``nbytes`` at ``rate`` while the link's DMA reads host DRAM for
    ``link_s`` seconds from the start, the CPU's reads capped at ``cap`` meanwhile: at the
    capped rate for as long as the link streams, then at ``rate`` (continuous in ``link_s``:
    a small T share slows the CPU experts a little, not to the capped rate at once). The CPU
    experts measured 55-92 GB/s while T streamed against a solo 104-106 (2026-12-01g-h200)."""
    if link_s <= 0 or cap >= rate:
        return nbytes / rate
    if nbytes <= link_s * cap:
        return nbytes / cap
    return link_s + (nbytes - link_s * cap) / rate


def graphed(profile: "HardwareProfile", load: StepLoad, experts_on_cpu: bool) -> bool:
    """Whether the engine runs a step of this load as CUDA graphs: on a GPU, every KV token in
    HBM (resident); with CPU experts in any layer (``experts_on_cpu``: whether any layer's are
    on the CPU) only where their calls are graphed too (``layers/cpu_experts_graph.py``: in
    resident steps unless ``WRITESCOPE_CPU_EXPERTS_GRAPHED=0``)."""
    if not profile.has_gpu or load.streamed_tokens > 0 or load.cpu_tokens > 0:
        return False
    if experts_on_cpu:
        from ..layers import cpu_experts_graph
        try:
            return cpu_experts_graph.enabled(resident=True)
        except ValueError:  # a misspelt setting: the engine refuses it at start
            return False
    return True


def launch_cost_s(profile: "HardwareProfile", load: StepLoad, experts_on_cpu: bool) -> float:
    """Seconds one of a layer's kernels costs beyond its bytes: a graph's kernel in a graphed
    step (when the profile measured it), an eager launch otherwise."""
    if profile.graph_launch_s is not None and graphed(profile, load, experts_on_cpu):
        return profile.graph_launch_s
    return profile.launch_s


def layer_time(profile: "HardwareProfile", cfg: "ModelConfig", layer: int, load: StepLoad,
               experts_on_cpu: ExpertsOnCpu, corr: Corrections = Corrections(),
               regime: tuple[bool, bool] | None = None, pipelined: bool = False) -> LayerTime:
    """One layer's times. ``regime`` = (cpu attends, pcie streams) overrides the contention
    regime (the optimiser uses it for the open interval between the ends). ``pipelined``: the
    engine runs decode steps with CPU attention as two interleaved sub-batches (with at least
    two sequences and the experts on the GPU); the CPU's attention then overlaps the GPU's
    dense work instead of following it: ``compute = max(PIPE_GPU_FACTOR x (dense + experts) +
    gpu_attn, cpu_attn)``. The round trip stays one per layer: two calls, but each one's latency
    (query copy, flag, result) hides behind the other sub-batch's GPU work. ``experts_on_cpu``
    (see :func:`cpu_expert_layers`): this layer's experts run on the CPU when it is among those
    layers; the step's launches, round trip and pipelining follow whether any layer's do."""
    cpu_layers = cpu_expert_layers(cfg, experts_on_cpu)
    any_cpu = bool(cpu_layers)
    experts_on_cpu = layer in cpu_layers  # this layer's
    kvb = kv_bytes_per_token_layer(cfg)
    fam = attn_family(cfg)
    p = layer_param_counts(cfg, layer)
    n_act = active_experts(cfg.num_experts, cfg.num_experts_per_tok, load.batch_size) if p["expert"] else 0.0
    expert_bytes = n_act * p["expert"] * expert_weight_bytes(cfg, experts_on_cpu)

    cpu_attends, streams = regime if regime is not None else (load.cpu_tokens > 0,
                                                              load.streamed_tokens > 0)
    cpu_busy = cpu_attends or (experts_on_cpu and expert_bytes > 0)
    h2d, cpu_cap = _concurrent(profile, cpu_busy, streams)

    # GPU: dense weights from HBM + a fixed number of launches; attention over resident + staged
    dense_s = ((p["attn"] + p["mlp"]) * WEIGHT_BYTES / profile.weight_read_Bps
               + KERNELS_PER_LAYER * launch_cost_s(profile, load, any_cpu))
    gpu_attn_s = corr.gpu * (load.resident_tokens + load.streamed_tokens) * kvb / profile.device_attn_rate(fam)
    # CPU attention: a fixed round trip whenever it attends anything, then its bytes
    cpu_attn_s = 0.0
    if cpu_attends:
        rate_c = min(profile.cpu_attn_rate(fam, "C"), cpu_cap)
        rate_t = min(profile.cpu_attn_rate(fam, "T"), cpu_cap)
        fixed = corr.cpu if corr.cpu_fixed is None else corr.cpu_fixed
        cpu_attn_s = (fixed * profile.attn_roundtrip_s(any_cpu)
                      + corr.cpu * (load.cpu_c_tokens * kvb / rate_c
                          + load.cpu_t_tokens * kvb / rate_t))
    pcie_s = corr.pcie * load.streamed_tokens * kvb / h2d if streams else 0.0
    # routed experts
    knee = math.inf
    link_expert_s = 0.0
    if not expert_bytes:
        expert_s = 0.0
    elif experts_on_cpu:
        fp8 = getattr(cfg, "quantization", None) is not None
        rate = profile.cpu_expert_rate(cfg.hidden_size, cfg.moe_intermediate_size, fp8)
        if streams and cpu_cap < rate:
            knee = expert_bytes / cpu_cap
        # a step that spills no KV leaves the link to a share of the experts (expert_link.py):
        # the GPU reads it meanwhile, the CPU its own part capped at the concurrent rate while
        # the link reads. (The engine gives the link experts in any step that streams no KV,
        # also one whose spilled KV the CPU attends; the model leaves those out, so that the
        # CPU share's optimum does not jump to 1 to free the link, against placements fixed at
        # write time: there the prediction is pessimistic, the experts' correction absorbs it.
        # FP8 experts stay on the CPU alone: the link's kernels read no FP8 tiles.)
        share = 0.0 if load.spilled_tokens > 0 or fp8 else link_expert_share(profile,
                                                                             load.batch_size)
        cpu_bytes = expert_bytes * (1.0 - share)
        if share > 0:
            link_expert_s = expert_bytes * share / (profile.concurrent_h2d_Bps
                                                    or profile.h2d_pinned_Bps)
            cap = profile.concurrent_cpu_read_Bps or rate
            cpu_part = _beside_the_link(cpu_bytes, rate, cap, link_expert_s)
        else:
            cpu_part = _beside_the_link(cpu_bytes, rate, cpu_cap, pcie_s)
        expert_s = corr.expert * (profile.cpu_roundtrip_s + cpu_part)
    else:
        expert_s = expert_bytes / profile.weight_read_Bps

    pipelined = (pipelined and cpu_attends and profile.has_gpu and load.batch_size >= 2
                 and not any_cpu)
    if pipelined:
        compute_s = max(PIPE_GPU_FACTOR * (dense_s + expert_s) + gpu_attn_s, cpu_attn_s)
    elif profile.has_gpu:
        compute_s = dense_s + max(gpu_attn_s, cpu_attn_s) + max(expert_s, link_expert_s)
    else:  # one processor does everything, one thing at a time
        compute_s = dense_s + gpu_attn_s + cpu_attn_s + expert_s
    return LayerTime(dense_s, gpu_attn_s, cpu_attn_s, expert_s, pcie_s, compute_s,
                     max(compute_s, pcie_s), pipelined, knee)


def predict_step(profile: "HardwareProfile", cfg: "ModelConfig", load: StepLoad,
                 experts_on_cpu: ExpertsOnCpu, corr: Corrections = Corrections(),
                 regime: tuple[bool, bool] | None = None, pipelined: Pipelined = False
                 ) -> StepPrediction:
    """Predicted time of one decode step with ``load`` (see the module docstring).
    ``pipelined``: the form the engine gives the step (:data:`Pipelined`)."""
    if pipelined and load.batch_size >= 2 and cpu_expert_layers(cfg, experts_on_cpu) and \
            graphed(profile, load, True):
        split = _split_experts_step(profile, cfg, load, experts_on_cpu, corr, regime)
        if pipelined != "auto":
            return split
        whole = predict_step(profile, cfg, load, experts_on_cpu, corr, regime, False)
        return split if split.step_s < whole.step_s else whole
    if pipelined in EXPERT_FORMS:  # they split only the steps above
        pipelined = False
    # layers of one kind (dense MLP, MoE with its experts on the GPU, MoE with them on the CPU)
    # take the same time: compute each kind once, and sum kinds times their counts
    cpu_layers = cpu_expert_layers(cfg, experts_on_cpu)
    order, groups = _layer_kinds(cfg.num_layers, _facts(cfg)["moe_layers"], cpu_layers)
    kinds = {k: layer_time(profile, cfg, first, load, cpu_layers, corr, regime, pipelined)
             for k, first, _ in groups}
    layers = tuple(kinds[k] for k in order)
    head_s = cfg.vocab_size * cfg.hidden_size * WEIGHT_BYTES / profile.weight_read_Bps

    def total(field_of, which=lambda k: True) -> float:
        return sum(n * field_of(kinds[k]) for k, _, n in groups if which(k))
    return StepPrediction(
        step_s=total(lambda lt: lt.total_s) + layers[0].pcie_s + head_s,
        gpu_attn_s=total(lambda lt: lt.gpu_attn_s),
        cpu_attn_s=total(lambda lt: lt.cpu_attn_s),
        pcie_s=total(lambda lt: lt.pcie_s),
        expert_s=total(lambda lt: lt.expert_s),
        dense_s=total(lambda lt: lt.dense_s) + head_s,
        cpu_share=load.cpu_share,
        layers=layers,
        cpu_expert_s=total(lambda lt: lt.expert_s, lambda k: k[1]))


@functools.lru_cache(maxsize=256)
def _layer_kinds(num_layers: int, moe_layers: frozenset, cpu_layers: frozenset
                 ) -> tuple[tuple[tuple[bool, bool], ...], tuple[tuple[tuple[bool, bool], int, int], ...]]:
    """Each layer's kind ``(MoE, experts on the CPU)``, and per kind its first layer and its
    count: a step's prediction times each kind once and sums kinds times counts. (Loops over
    the layers, three predictions a decode step with CPU experts, made most of the planner's
    feedback: 1.2 ms a Qwen3-30B-A3B step under cProfile on an H100 host,
    bench/results/2026-12-06b-h100 call 2.)"""
    order = tuple((i in moe_layers, i in cpu_layers) for i in range(num_layers))
    first: dict = {}
    count: dict = {}
    for i, k in enumerate(order):
        first.setdefault(k, i)
        count[k] = count.get(k, 0) + 1
    return order, tuple((k, first[k], count[k]) for k in first)


def _split_experts_step(profile: "HardwareProfile", cfg: "ModelConfig", load: StepLoad,
                        experts_on_cpu: ExpertsOnCpu, corr: Corrections,
                        regime: tuple[bool, bool] | None) -> StepPrediction:
    """A decode step with routed experts on the CPU run as two interleaved sub-batches
    (``engine/graphs.pipelined_pieces``, the sequences halved, the first taking the odd one):
    while the CPU computes one sub-batch's experts of a CPU layer, the GPU runs the other's
    layers up to that layer. The engine splits only steps whose KV is all in HBM (no CPU
    attention, nothing streamed: :func:`predict_step` calls this for those alone). Each
    sub-batch's layers are timed at its own load (so the dense weights are read twice and each
    half routes to its own experts); the GPU's work ``G`` (dense, attention, experts on the
    GPU) and the CPU's experts ``C`` are summed over both, each CPU layer's round trip counted
    once: the second call's latency hides behind the other sub-batch's work. With ``k`` CPU
    layers each sub-batch's chain is ``k + 1`` GPU segments around ``k`` CPU calls; two such
    chains take ``G`` where the GPU is the longer side, and ``C`` plus one segment of each
    sub-batch (``G / (k + 1)``: before the CPU's first call, after its last) where the CPU
    is."""
    cpu_layers = cpu_expert_layers(cfg, experts_on_cpu)
    order, groups = _layer_kinds(cfg.num_layers, _facts(cfg)["moe_layers"], cpu_layers)
    n = load.batch_size
    timed = []  # per sub-batch, per layer kind
    for b in ((n + 1) // 2, n // 2):
        half = StepLoad(b, load.resident_tokens * b / n, 0.0, 0.0, 0.0)
        timed.append({k: layer_time(profile, cfg, first, half, cpu_layers, corr, regime)
                      for k, first, _ in groups})
    a, b = timed
    expert_fixed = corr.expert * profile.cpu_roundtrip_s
    # (kind k: (MoE, experts on the CPU); n its layers)
    g_s = sum(n * sum(lt.dense_s + lt.gpu_attn_s + (0.0 if k[1] else lt.expert_s)
                      for lt in (a[k], b[k])) for k, _, n in groups)
    cpu_expert_s = sum(n * (a[k].expert_s + b[k].expert_s - expert_fixed)
                       for k, _, n in groups if k[1])
    lines = (g_s, cpu_expert_s + g_s / (len(cpu_layers) + 1))
    head_s = cfg.vocab_size * cfg.hidden_size * WEIGHT_BYTES / profile.weight_read_Bps
    both = sum(n * (a[k].gpu_attn_s + b[k].gpu_attn_s) for k, _, n in groups)
    dense = sum(n * (a[k].dense_s + b[k].dense_s) for k, _, n in groups)
    gpu_experts = sum(n * (a[k].expert_s + b[k].expert_s) for k, _, n in groups if not k[1])
    return StepPrediction(
        step_s=max(lines) + head_s,
        gpu_attn_s=both, cpu_attn_s=0.0, pcie_s=0.0,
        expert_s=cpu_expert_s + gpu_experts,
        dense_s=dense + head_s,
        cpu_share=load.cpu_share, layers=tuple(a[k] for k in order), cpu_expert_s=cpu_expert_s,
        lines=lines)


def load_at_share(batch_size: int, resident: float, c_tokens: float, t_tokens: float, x: float,
                  free: bool = False, fixed_t: float = 0.0) -> StepLoad:
    """The load when the CPU attends a share ``x`` of the spilled tokens.

    Placed (``free=False``): the CPU takes all C tokens, then reads T tokens in place; the GPU
    streams the remaining T tokens (``x`` is clamped to ``[C/S, (C+T)/S]``). Free
    (``free=True``, for planning where blocks *should* go): the CPU's share is in C and the rest
    in T (``x`` clamped to ``[0, (C+T)/S]``).

    ``fixed_t``: T tokens streamed whatever the share -- T blocks that several sequences hold,
    counted once (the staging ring moves a shared block once; the cache keeps them off the CPU,
    ``kvcache/step_plan.py``). The caller counts their other listings as resident (the GPU reads
    the staged copy from HBM once per sequence). The spilled tokens ``S`` the share is of are
    ``C + T + fixed_t``."""
    spilled = c_tokens + t_tokens + fixed_t
    flexible = c_tokens + t_tokens
    if free:
        cpu = min(max(x * spilled, 0.0), flexible)
        return StepLoad(batch_size, resident, flexible - cpu + fixed_t, cpu, 0.0)
    cpu = min(max(x * spilled, c_tokens), flexible)
    cpu_t = cpu - c_tokens
    return StepLoad(batch_size, resident, t_tokens - cpu_t + fixed_t, c_tokens, cpu_t)


@dataclass(frozen=True)
class SharePlan:
    cpu_share: float
    prediction: StepPrediction


def optimal_cpu_share(profile: "HardwareProfile", cfg: "ModelConfig", batch_size: int,
                      resident: float, c_tokens: float, t_tokens: float,
                      experts_on_cpu: ExpertsOnCpu,
                      corr: Corrections = Corrections(), free: bool = False,
                      min_gain: float = MIN_GAIN, pipelined: Pipelined = False,
                      fixed_t: float = 0.0) -> SharePlan:
    """The CPU share of spilled tokens that minimises predicted step time.

    ``c_tokens`` must go to the CPU (their layout is the CPU's); ``t_tokens`` may go either way
    (the CPU reads them in place at the T rate); ``fixed_t`` (shared T blocks, counted once)
    stream whatever the share (:func:`load_at_share`). With ``free=True`` the split is not
    constrained by any placement (see :func:`target_share`). Ties go to the smallest share:
    less CPU work for the same predicted time. The CPU starts attending (leaves the smallest
    share) only for a predicted gain of at least ``min_gain`` of the step: below that the
    model's own error and the costs it leaves out (CPU threads woken, caches polluted, C blocks
    committed for good) outweigh it. This also keeps the share from taking small side gains --
    CPU attention that hides inside GPU attention time only to shorten the first layer's copy
    -- that would make it dip as sequences grow.
    """
    fixed_t = max(0.0, fixed_t)
    spilled = c_tokens + t_tokens + fixed_t
    experts_on_cpu = cpu_expert_layers(cfg, experts_on_cpu)  # once, not at every candidate
    if c_tokens + t_tokens <= 0:
        load = StepLoad(batch_size, resident, fixed_t, 0.0, 0.0)
        return SharePlan(0.0, predict_step(profile, cfg, load, experts_on_cpu, corr,
                                           pipelined=pipelined))
    hi = (c_tokens + t_tokens) / spilled
    lo = 0.0 if free else c_tokens / spilled

    def at(x: float, regime: tuple[bool, bool] | None = None) -> StepPrediction:
        load = load_at_share(batch_size, resident, c_tokens, t_tokens, x, free, fixed_t)
        return predict_step(profile, cfg, load, experts_on_cpu, corr, regime, pipelined)

    # the two ends, each in its own contention regime (no CPU attention / no streaming)
    candidates = {lo: at(lo), hi: at(hi)}
    if hi > lo:
        # inside, both paths run and each layer's time is max of three lines in x:
        # dense + gpu_attn + experts, dense + cpu_attn + experts, pcie. The minimum of a sum of
        # such pieces lies where two lines of some layer cross, or where a line bends: the CPU
        # experts' term does where the link time passes their knee (:func:`_beside_the_link`).
        both = (True, True)
        pa, pb = at(lo, both), at(hi, both)
        cuts = {lo, hi}
        for la, lb in zip(_kinds(cfg, pa), _kinds(cfg, pb)):
            k = la.expert_knee_s if la.expert_knee_s < math.inf else lb.expert_knee_s
            if k < math.inf and (la.pcie_s - k) * (lb.pcie_s - k) < 0:
                cuts.add(lo + (hi - lo) * (la.pcie_s - k) / (la.pcie_s - lb.pcie_s))
        edges = sorted(cuts)
        ends = {x: (pa if x == lo else pb if x == hi else at(x, both)) for x in edges}
        for x in edges[1:-1]:
            candidates[x] = ends[x]
        for a, b in zip(edges, edges[1:]):  # on each piece every line is straight
            for la, lb in zip(_kinds(cfg, ends[a]), _kinds(cfg, ends[b])):
                fa = _lines(la, profile.has_gpu)
                fb = _lines(lb, profile.has_gpu)
                for i in range(len(fa)):
                    for j in range(i + 1, len(fa)):
                        d0, d1 = fa[i] - fa[j], fb[i] - fb[j]
                        if d0 * d1 < 0:
                            x = a + (b - a) * d0 / (d0 - d1)
                            candidates[x] = at(x, both)
    best = min(p.step_s for p in candidates.values())
    x_best = min(x for x, p in candidates.items() if p.step_s <= best * (1 + 1e-9))
    if x_best > lo and candidates[lo].step_s <= best * (1 + min_gain):
        x_best = lo
    return SharePlan(x_best, candidates[x_best])


def _lines(lt: LayerTime, has_gpu: bool) -> tuple[float, ...]:
    """The linear pieces whose max is the layer's time (see :func:`layer_time`)."""
    if not has_gpu:
        return (lt.compute_s,)
    if lt.pipelined:
        return (PIPE_GPU_FACTOR * (lt.dense_s + lt.expert_s) + lt.gpu_attn_s, lt.cpu_attn_s,
                lt.pcie_s)
    return (lt.dense_s + lt.gpu_attn_s + lt.expert_s, lt.dense_s + lt.cpu_attn_s + lt.expert_s,
            lt.pcie_s)


def _kinds(cfg: "ModelConfig", pred: StepPrediction) -> list[LayerTime]:
    """One LayerTime per distinct layer kind (:func:`predict_step` shares one object among a
    kind's layers), in the order of their first layers: the same order for any two predictions
    of one model and placement."""
    out, seen = [], set()
    for lt in pred.layers:
        if id(lt) not in seen:
            seen.add(id(lt))
            out.append(lt)
    return out


def target_share(profile: "HardwareProfile", cfg: "ModelConfig", batch_size: int,
                 resident: float, spilled: float, experts_on_cpu: ExpertsOnCpu,
                 corr: Corrections = Corrections(), pipelined: Pipelined = False,
                 min_gain: float = PLACEMENT_MIN_GAIN, fixed_t: float = 0.0) -> SharePlan:
    """The share the write scope aims at: the best split if every CPU token sat in C (the
    CPU's layout) and every GPU token in T, i.e. with no placement constraint. Blocks placed
    in C stay there, so the CPU gets a share only for a predicted gain of ``min_gain`` of the
    step (:data:`PLACEMENT_MIN_GAIN`), not the step plan's ``MIN_GAIN``. ``fixed_t``: shared T
    tokens, counted once, that stream whatever the split (``spilled`` leaves them out; see
    :func:`load_at_share`)."""
    return optimal_cpu_share(profile, cfg, batch_size, resident, 0.0, spilled, experts_on_cpu,
                             corr, free=True, pipelined=pipelined, min_gain=min_gain,
                             fixed_t=fixed_t)


def bandwidth_ratio(profile: "HardwareProfile", cfg: "ModelConfig") -> float:
    """``B_cpu / (B_cpu + B_pcie)`` with both paths busy: the share long sequences tend to (and
    what a static split chosen from the hardware alone would pick)."""
    fam = attn_family(cfg)
    if not profile.has_gpu:
        rc, other = profile.cpu_attn_rate(fam, "C"), profile.device_attn_rate(fam)
        return rc / (rc + other)
    h2d, cap = _concurrent(profile, True, True)
    rc = min(profile.cpu_attn_rate(fam, "C"), cap)
    return rc / (rc + h2d)


# ----------------------------------------------------------------------------- batches
def resident_tokens(lengths: Sequence[int], gpu_kv_tokens: float) -> list[float]:
    """Tokens per sequence that fit in G (filled in batch order, as G-first placement does)."""
    out, left = [], float(gpu_kv_tokens)
    for n in lengths:
        take = min(float(n), max(left, 0.0))
        out.append(take)
        left -= take
    return out


def gpu_kv_capacity_tokens(cfg: "ModelConfig", vram_budget: int | None,
                           experts_on_cpu: ExpertsOnCpu,
                           reserve_bytes: int = 2 ** 30) -> float:
    """KV tokens the G region can hold in a VRAM budget: budget - GPU weights - a reserve for
    activations, W tails and the staging ring (1 GiB by default). ``None``: unlimited."""
    if vram_budget is None:
        return float("inf")
    free = vram_budget - gpu_weight_bytes(cfg, experts_on_cpu) - reserve_bytes
    return max(0.0, free / (kv_bytes_per_token_layer(cfg) * cfg.num_layers))


def _cpu_read_ceiling(profile: "HardwareProfile", cfg: "ModelConfig", experts_on_cpu: ExpertsOnCpu
                      ) -> float:
    """The CPU's solo read ceiling for the bound: the read probe's rate, or that of one of this
    model's CPU kernels where it measured faster. A kernel that reads faster than the probe shows
    the probe is not the ceiling; bounding with the probe would put the bound above the model's
    own step (2026-12-02 calibration: CPU experts 105 GB/s and GQA attention 108 GB/s against a
    96 GB/s probe)."""
    rates = [profile.cpu_read_Bps]
    if profile.cpu_attn:
        fam = attn_family(cfg)
        rates += [profile.cpu_attn_rate(fam, "C"), profile.cpu_attn_rate(fam, "T")]
    if cpu_expert_layers(cfg, experts_on_cpu) and profile.cpu_expert and cfg.num_experts:
        rates.append(profile.cpu_expert_rate(cfg.hidden_size, cfg.moe_intermediate_size))
    return max(rates)


def _host_io_s(profile: "HardwareProfile", kv: float, cpu_expert: float,
               c_solo: float | None = None) -> float:
    """Least time for the host's two read paths to serve ``kv`` spilled bytes while the CPU also
    reads ``cpu_expert`` bytes of routed experts: the CPU takes a share x of the KV, the link the
    rest. While the link streams, each path runs at its concurrent ceiling; once the link is
    done, the CPU reads what it has left at its solo ceiling ``c_solo`` (by default the read
    probe's rate). The time is ``max(L, CPU)`` with ``L = (1 - x) kv / h``: falling in x while
    the link is the longer path, linear in x beyond the balance point, so the least is at the
    balance, at x = 0 (the experts alone outlast the link: they read at the concurrent ceiling
    beside it, at their own after it) or at x = 1 (the CPU alone). With no experts the link
    alone (x = 0) runs at its solo ceiling."""
    c_solo = c_solo or profile.cpu_read_Bps
    h_solo = profile.h2d_pinned_Bps
    c = min(profile.concurrent_cpu_read_Bps or c_solo, c_solo)
    h = profile.concurrent_h2d_Bps or h_solo
    if kv <= 0:
        return cpu_expert / c_solo

    def at(x: float) -> float:
        link = (1.0 - x) * kv / h
        cpu = cpu_expert + x * kv
        if cpu <= c * link:
            return link
        return link + (cpu - c * link) / c_solo

    balance = (kv / h - cpu_expert / c) / (kv / h + kv / c)
    best = min(at(0.0), at(min(max(balance, 0.0), 1.0)), at(1.0))
    if cpu_expert <= 0:
        best = min(best, kv / h_solo)
    return best


def _host_io_link_experts_s(profile: "HardwareProfile", kv: float, cpu_expert: float,
                            c_solo: float) -> float:
    """:func:`_host_io_s` for steps whose link reads routed experts instead of KV (the engine's
    small decode steps that stream none, ``layers/expert_link.py``): the CPU reads the ``kv``
    spilled bytes and what the link leaves of the experts. The link takes ``L`` of the experts'
    bytes, both read at their concurrent ceilings while it does; the least time is at the
    balance of ``(kv + ex - L) / c`` and ``L / h``, or at ``L = ex`` when the CPU's KV alone
    outlasts the link's experts, or with the CPU alone at its solo ceiling."""
    c = min(profile.concurrent_cpu_read_Bps or c_solo, c_solo)
    h = profile.concurrent_h2d_Bps or profile.h2d_pinned_Bps
    total = kv + cpu_expert
    link = min(cpu_expert, total * h / (c + h))
    return min(max((total - link) / c, link / h), total / c_solo)


def roofline_bound_s(profile: "HardwareProfile", cfg: "ModelConfig", lengths: Sequence[int],
                     gpu_kv_tokens: float, experts_on_cpu: ExpertsOnCpu,
                     cpu_expert_bytes: float | None = None) -> float:
    """A lower bound on step time, per layer the larger of two resources' times, each at its
    measured ceiling with no kernel inefficiency, fixed cost or dependency between them:

    * the GPU reads the layer's dense weights, its routed experts when they are on the GPU, and
      the resident KV from HBM;
    * the host serves the spilled KV over the link and the CPU's DRAM read, shared with the
      routed experts' weights when they are on the CPU (:func:`_host_io_s`) -- the CPU cannot
      read experts and attend KV at full speed at once; with no spilled KV, in batches small
      enough for the link to take experts (``layers/expert_link.py``), the experts over both
      (:func:`_host_io_link_experts_s`), where that is less.

    With one sequence the layers run one after another, each layer's two resources at best at
    once: the bound sums each layer's larger time. With two or more the engine may split a step
    into two sub-batches whose CPU work overlaps the other sub-batch's GPU work of other layers
    (``engine/graphs.pipelined_pieces``; :func:`_split_experts_step`): then only each
    resource's whole step of work bounds it, the larger of the two sums (the work counted once,
    as for the whole batch: split, the dense weights are read twice and each half routes to its
    own experts, more). That is never more than the per-layer sum, and less where the layers
    differ (some layers' experts on the CPU, dense layers among MoE ones).

    Without a GPU one processor reads everything, one thing after another.

    The routed experts' bytes are those of uniform routing, unless ``cpu_expert_bytes`` gives the
    bytes a step's CPU expert calls actually read (``cpu_expert_bytes`` of the step timing; a
    router activates fewer distinct experts than uniform routing when it concentrates): then the
    experts' bytes of every CPU layer are scaled so that their sum is that figure.

    ``experts_on_cpu``: all MoE layers, none, or a flag per layer (:func:`cpu_expert_layers`);
    each layer's experts are charged where they run."""
    res = sum(resident_tokens(lengths, gpu_kv_tokens))
    spilled = sum(lengths) - res
    kvb = kv_bytes_per_token_layer(cfg)
    b = len(lengths)
    act = active_experts(cfg.num_experts, cfg.num_experts_per_tok, b)
    cpu_layers = cpu_expert_layers(cfg, experts_on_cpu)
    scale = 1.0
    if cpu_expert_bytes is not None and cpu_layers:
        uniform = sum(act * layer_param_counts(cfg, i)["expert"]
                      * expert_weight_bytes(cfg, True) for i in cpu_layers)
        scale = float(cpu_expert_bytes) / uniform if uniform > 0 else 1.0
    c_solo = _cpu_read_ceiling(profile, cfg, cpu_layers)
    total = gpu_sum = host_sum = 0.0
    for i in range(cfg.num_layers):
        p = layer_param_counts(cfg, i)
        experts_on_cpu = i in cpu_layers  # this layer's
        exp = (scale if experts_on_cpu else 1.0) * act * p["expert"] * expert_weight_bytes(cfg)
        weights = (p["attn"] + p["mlp"]) * WEIGHT_BYTES / profile.weight_read_Bps
        if not profile.has_gpu:
            total += weights + (exp + (spilled + res) * kvb) / profile.cpu_read_Bps
            continue
        gpu = weights + (0.0 if experts_on_cpu else exp / profile.weight_read_Bps) \
            + res * kvb / profile.weight_read_Bps
        host = _host_io_s(profile, spilled * kvb, exp if experts_on_cpu else 0.0, c_solo)
        if experts_on_cpu and spilled <= 0 and link_expert_share(profile, b) > 0:
            host = min(host, _host_io_link_experts_s(profile, 0.0, exp, c_solo))
        total += max(gpu, host)
        gpu_sum += gpu
        host_sum += host
    if profile.has_gpu and b >= 2:  # two sub-batches may overlap one's CPU work with the other's
        total = max(gpu_sum, host_sum)
    return total + cfg.vocab_size * cfg.hidden_size * WEIGHT_BYTES / profile.weight_read_Bps


def plan_for_lengths(profile: "HardwareProfile", cfg: "ModelConfig", lengths: Sequence[int],
                     gpu_kv_tokens: float, experts_on_cpu: ExpertsOnCpu, policy: str,
                     static_share: float = 0.5, corr: Corrections = Corrections(),
                     pipelined: Pipelined = False) -> SharePlan:
    """Predicted share and step for one batch under a policy, in the steady state where the
    placement has reached its target (``writescope`` puts its share in C; ``transfer`` all in T;
    ``cpu`` all in C; ``static`` a fixed share in C). ``pipelined``: the engine splits decode
    steps into two sub-batches (:func:`predict_step`)."""
    res = sum(resident_tokens(lengths, gpu_kv_tokens))
    spilled = float(sum(lengths)) - res
    b = len(lengths)
    if policy == "writescope":
        return target_share(profile, cfg, b, res, spilled, experts_on_cpu, corr, pipelined)
    shares = {"transfer": 0.0, "cpu": 1.0, "static": static_share}
    if policy not in shares:
        raise ValueError(f"unknown policy {policy!r}")
    x = shares[policy] if spilled > 0 else 0.0
    load = StepLoad(b, res, (1 - x) * spilled, x * spilled, 0.0)
    return SharePlan(x, predict_step(profile, cfg, load, experts_on_cpu, corr,
                                     pipelined=pipelined))


__all__ = [
    "StepLoad", "Corrections", "LayerTime", "StepPrediction", "SharePlan",
    "kv_bytes_per_token_layer", "attn_family", "active_experts", "layer_param_counts",
    "expert_weight_bytes", "WEIGHT_BYTES", "ExpertsOnCpu", "cpu_expert_layers",
    "gpu_weight_bytes", "layer_time", "predict_step", "load_at_share", "optimal_cpu_share",
    "target_share", "resident_tokens", "gpu_kv_capacity_tokens", "roofline_bound_s",
    "plan_for_lengths", "bandwidth_ratio",
]
