"""The hardware profile: this machine's measured ceilings, saved as versioned JSON.

``writescope calibrate`` measures (GPU terms only where CUDA is present):

=========================  =====================================================================
field                      what
=========================  =====================================================================
h2d_pinned_Bps             host->device copy from pinned memory, large copies
h2d_pinned_block_Bps       the same, one KV-block-sized (512 KiB) copy at a time
h2d_pageable_Bps           host->device from ordinary (pageable) memory
d2h_pinned_Bps             device->host into pinned memory
hbm_Bps                    device->device copy, (read + written bytes) / s
cpu_read_Bps               CPU threads summing a DRAM-sized array
concurrent_h2d_Bps         H2D while the CPU threads read DRAM ...
concurrent_cpu_read_Bps    ... and the CPU read rate meanwhile
cpu_attn                   the CPU attention kernel's KV bytes/s per shape family
                           (``attn_family``), on C blocks (CPU layout) and T blocks (GPU layout)
cpu_attn_isa               the kernel variant that gave those rates (fastest of those this CPU has)
cpu_attn_prefetch_blocks   with the AMX variant, the software-prefetch distance that gave them
                           (blocks ahead, of 0, 1, 2; 0: none); optional
cpu_attn_variants          the kernel variants the calibration timed; a cached profile that lacks
                           a variant this build has is measured again (optional)
device_attn                attention rate on the device path (the GPU, or the torch path where
                           there is no GPU), KV bytes/s per family
cpu_expert                 routed-expert FFN on the CPU: weight bytes/s per expert shape
cpu_roundtrip_s            fixed cost of one CPU round trip per layer (queries to the host,
                           the CPU kernel's start on tiny input, results back, sync); the CPU
                           experts' fixed cost, and CPU attention's where no value below
cpu_attn_roundtrip_s       the same for CPU attention as the engine's decode step pays it: the
                           hybrid step's chain over tiny input, the kernel's team spinning on
                           each layer's ready word (optional; not with CPU experts, where the
                           team does not spin)
launch_s                   one small device kernel launch (the per-layer fixed GPU cost)
graph_launch_s             one small kernel's share of a CUDA graph's replay: the per-kernel
                           cost of a decode step whose KV is all in HBM (run as CUDA graphs);
                           optional (without it such steps are charged ``launch_s``)
=========================  =====================================================================

All rates are bytes per second. The engine loads a profile with :func:`load_or_calibrate`
(``--profile`` / ``$WRITESCOPE_PROFILE`` / a cached quick calibration of this machine).
Calibration is in :mod:`writescope.planner.calibrate`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import tempfile
import math
import os
import platform
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROFILE_VERSION = 1


@dataclass
class HardwareProfile:
    machine: dict[str, Any]
    cpu_threads: int
    cpu_read_Bps: float
    cpu_attn: dict[str, dict[str, float]]   # family -> {"C": Bps, "T": Bps}
    device_attn: dict[str, float]           # family -> Bps
    cpu_expert: dict[str, float]            # "h{hidden}-i{inter}" -> weight Bps
    cpu_roundtrip_s: float
    launch_s: float
    # GPU terms (None on a machine without CUDA)
    h2d_pinned_Bps: float | None = None
    h2d_pinned_block_Bps: float | None = None
    h2d_pageable_Bps: float | None = None
    d2h_pinned_Bps: float | None = None
    hbm_Bps: float | None = None
    concurrent_h2d_Bps: float | None = None
    concurrent_cpu_read_Bps: float | None = None
    # the fastest CPU attention variant per family (bf16 KV), as calibrated; {} = the default
    cpu_attn_isa: dict[str, str] = field(default_factory=dict)
    # and the AMX variant's fastest software-prefetch distance per family; {} = the default
    cpu_attn_prefetch_blocks: dict[str, int] = field(default_factory=dict)
    cpu_attn_roundtrip_s: float | None = None
    graph_launch_s: float | None = None
    # the CPU attention variants timed for cpu_attn_isa ([]: not recorded)
    cpu_attn_variants: list[str] = field(default_factory=list)
    # provenance
    cpu_attn_kernel: str = ""
    cpu_expert_kernel: str = ""
    quick: bool = False
    created: str = ""
    command: str = ""
    version: int = PROFILE_VERSION
    notes: list[str] = field(default_factory=list)

    # ------------------------------------------------------------------ derived
    def attn_roundtrip_s(self, experts_on_cpu: bool) -> float:
        """CPU attention's fixed cost per layer: the hybrid step's measured chain where its
        team spins (no CPU experts beside it), else the plain round trip."""
        if self.cpu_attn_roundtrip_s is not None and not experts_on_cpu:
            return self.cpu_attn_roundtrip_s
        return self.cpu_roundtrip_s

    @property
    def has_gpu(self) -> bool:
        return self.h2d_pinned_Bps is not None and self.hbm_Bps is not None

    @property
    def weight_read_Bps(self) -> float:
        """Rate the device reads weights at: HBM (a copy's read+write rate approximates a pure
        read), or DRAM on a machine without a GPU."""
        return self.hbm_Bps if self.has_gpu else self.cpu_read_Bps

    def cpu_attn_rate(self, family: str, layout: str = "C") -> float:
        """CPU attention KV bytes/s for a shape family; a family not measured takes the slowest
        measured one (the feedback corrects it within a few steps)."""
        rates = self.cpu_attn.get(family)
        if rates is None:
            rates = min(self.cpu_attn.values(), key=lambda r: r.get("C", math.inf))
        return rates.get(layout) or rates["C"]

    def device_attn_rate(self, family: str) -> float:
        if family in self.device_attn:
            return self.device_attn[family]
        if self.device_attn:
            return min(self.device_attn.values())
        return self.weight_read_Bps

    @property
    def lacks_fp8_expert_rates(self) -> bool:
        """Whether the profile measured bf16 CPU experts but no FP8 ones (calibrated before
        they were measured): FP8 experts are then charged bf16's bytes/s, about 1.2-1.5x faster
        than the kernel ran on 16-core hosts (2026-12-05f-h200)."""
        return bool(self.cpu_expert) and not any(k.endswith(FP8_SUFFIX) for k in self.cpu_expert)

    def cpu_expert_rate(self, hidden: int, inter: int, fp8: bool = False) -> float:
        """Expert weight bytes/s for a shape: measured, else the measured shape nearest in size.
        ``fp8``: of block-wise FP8 experts (bytes as stored), where the profile measured them
        (``h...-i...-fp8`` keys); else the bf16 experts' rate."""
        if fp8:
            rates = {k: v for k, v in self.cpu_expert.items() if k.endswith(FP8_SUFFIX)}
            if rates:
                return _nearest(rates, hidden, inter, FP8_SUFFIX)
        rates = {k: v for k, v in self.cpu_expert.items() if not k.endswith(FP8_SUFFIX)}
        return _nearest(rates, hidden, inter, "")

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "HardwareProfile":
        if not isinstance(d, dict):
            raise ValueError(f"hardware profile: expected a JSON object, got "
                             f"{type(d).__name__ if d is not None else 'null'}")
        v = d.get("version")
        if v != PROFILE_VERSION or isinstance(v, bool):
            raise ValueError(f"hardware profile version {v!r} is not {PROFILE_VERSION}: "
                             "run `writescope calibrate` again")
        names = {f.name for f in dataclasses.fields(cls)}
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
                   and f.name not in d]
        if missing:
            raise ValueError(f"hardware profile lacks {', '.join(missing)}")
        p = cls(**{k: v for k, v in d.items() if k in names})
        p.validate()
        return p

    def validate(self) -> None:
        """Every field of the right type and range: a hand-edited or truncated profile is a
        one-line ValueError naming the field, not a crash deep in the planner."""
        def pos(name: str, v: Any) -> None:
            if not _is_number(v) or not v > 0 or not math.isfinite(v):
                raise ValueError(f"hardware profile: {name} must be a positive number, got {v!r}")

        def of_type(name: str, kind: type, what: str) -> Any:
            v = getattr(self, name)
            if not isinstance(v, kind):
                raise ValueError(f"hardware profile: {name} must be {what}, got {v!r}")
            return v
        of_type("machine", dict, "an object")
        for name in ("cpu_attn", "device_attn", "cpu_expert", "cpu_attn_isa",
                     "cpu_attn_prefetch_blocks"):
            of_type(name, dict, "an object")
        for name in ("cpu_attn_variants", "notes"):
            of_type(name, list, "a list")
        for name in ("cpu_attn_kernel", "cpu_expert_kernel", "created", "command"):
            of_type(name, str, "a string")
        of_type("quick", bool, "true or false")
        if not isinstance(self.cpu_threads, int) or isinstance(self.cpu_threads, bool) \
                or self.cpu_threads < 1:
            raise ValueError(f"hardware profile: cpu_threads must be a whole number >= 1, got "
                             f"{self.cpu_threads!r}")
        pos("cpu_read_Bps", self.cpu_read_Bps)
        if not self.cpu_attn:
            raise ValueError("hardware profile: cpu_attn is empty")
        for fam, r in self.cpu_attn.items():
            if not isinstance(r, dict):
                raise ValueError(f"hardware profile: cpu_attn[{fam}] must be an object of rates "
                                 f"per layout ({{\"C\": ..., \"T\": ...}}), got {r!r}")
            pos(f"cpu_attn[{fam}].C", r.get("C"))
            for lay, v in r.items():
                pos(f"cpu_attn[{fam}].{lay}", v)
        for fam, r in self.device_attn.items():
            pos(f"device_attn[{fam}]", r)
        for fam, isa in self.cpu_attn_isa.items():
            if not isinstance(isa, str):
                raise ValueError(f"hardware profile: cpu_attn_isa[{fam}] must be a variant's "
                                 f"name, got {isa!r}")
        for fam, n in self.cpu_attn_prefetch_blocks.items():
            if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= 64:
                raise ValueError(f"hardware profile: cpu_attn_prefetch_blocks[{fam}] must be a "
                                 f"whole number of blocks from 0 to 64, got {n!r}")
        if not self.cpu_expert:
            raise ValueError("hardware profile: cpu_expert is empty")
        for k, r in self.cpu_expert.items():
            if not re.fullmatch(r"h\d+-i\d+(" + re.escape(FP8_SUFFIX) + ")?", k):
                raise ValueError(f"hardware profile: cpu_expert key {k!r} is not an expert shape "
                                 f"(h<hidden>-i<intermediate>, e.g. {expert_key(2048, 1408)!r})")
            pos(f"cpu_expert[{k}]", r)
        for name in ("cpu_roundtrip_s", "launch_s", "cpu_attn_roundtrip_s", "graph_launch_s"):
            v = getattr(self, name)
            if v is None and name in ("cpu_attn_roundtrip_s", "graph_launch_s"):
                continue
            if not _is_number(v) or not 0 <= v < math.inf:
                raise ValueError(f"hardware profile: {name} must be a number of seconds >= 0, "
                                 f"got {v!r}")
        if (self.h2d_pinned_Bps is None) != (self.hbm_Bps is None):
            raise ValueError("hardware profile: h2d_pinned_Bps and hbm_Bps come together")
        if self.has_gpu:
            pos("h2d_pinned_Bps", self.h2d_pinned_Bps)
            pos("hbm_Bps", self.hbm_Bps)
        for name in ("h2d_pinned_block_Bps", "h2d_pageable_Bps", "d2h_pinned_Bps",
                     "concurrent_h2d_Bps", "concurrent_cpu_read_Bps"):
            if getattr(self, name) is not None:
                pos(name, getattr(self, name))

    def save(self, path: str | os.PathLike) -> None:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        # a unique temporary file, so two processes calibrating at once never clobber each other
        fd, tmp = tempfile.mkstemp(prefix=p.name + ".", suffix=".tmp", dir=p.parent)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(self.to_dict(), indent=1) + "\n")
            # mkstemp's file is 0600: the mode a plain open() would give (0666 less the umask),
            # so that a profile written for a team is readable by it
            os.chmod(tmp, 0o666 & ~_umask())
            os.replace(tmp, p)
        except BaseException:  # no temporary file left beside a profile that was not written
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike) -> "HardwareProfile":
        p = Path(path)
        if p.is_dir():
            raise ValueError(f"hardware profile {p} is a folder; give the profile JSON's file "
                             "name (`writescope calibrate --out FILE` writes one)")
        if not p.exists():
            raise ValueError(f"hardware profile {p}: no such file (`writescope calibrate --out "
                             "FILE` writes one)")
        try:
            d = json.loads(p.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{p} is not valid JSON: {e}") from e
        except OSError as e:  # unreadable: permissions, a device
            raise ValueError(f"hardware profile {p}: cannot read it ({e.strerror or e})") from e
        try:
            return cls.from_dict(d)
        except ValueError as e:  # which file, where several are about (--profile, the cache)
            raise ValueError(f"{p}: {e}") from e

    def scaled(self, **factors: float) -> "HardwareProfile":
        """A copy with some terms multiplied: ``cpu_attn=0.5`` halves every CPU attention rate
        (used to inject synthetic drift in tests and what-if plans)."""
        p = dataclasses.replace(self)
        for k, f in factors.items():
            if k == "cpu_attn":
                p.cpu_attn = {fam: {lay: v * f for lay, v in r.items()} for fam, r in self.cpu_attn.items()}
            elif k == "device_attn":
                p.device_attn = {fam: v * f for fam, v in self.device_attn.items()}
            elif k == "cpu_expert":
                p.cpu_expert = {s: v * f for s, v in self.cpu_expert.items()}
            elif getattr(self, k) is not None:
                setattr(p, k, getattr(self, k) * f)
        return p


def _is_number(v: Any) -> bool:
    """A JSON number (``true`` is not one, though Python's bool is an int)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def expert_key(hidden: int, inter: int, fp8: bool = False) -> str:
    return f"h{hidden}-i{inter}" + (FP8_SUFFIX if fp8 else "")


#: the ``cpu_expert`` keys of block-wise FP8 experts' rates
FP8_SUFFIX = "-fp8"


def _nearest(rates: dict[str, float], hidden: int, inter: int, suffix: str) -> float:
    """The rate of ``hidden x inter``'s key in ``rates``, else of the key nearest in size."""
    key = expert_key(hidden, inter) + suffix
    if key in rates:
        return rates[key]
    size = hidden * inter

    def dist(k: str) -> float:
        h, i = (int(v) for v in re.match(r"h(\d+)-i(\d+)", k).groups())
        return abs(math.log((h * i) / size))
    return rates[min(rates, key=dist)]


# ---------------------------------------------------------------------------------- locating
def machine_description() -> dict[str, Any]:
    """What the profile was measured on (no host names, no user data)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    desc: dict[str, Any] = {"cpu": cpu, "logical_cpus": os.cpu_count(), "python": platform.python_version()}
    try:
        import torch
        desc["torch"] = torch.__version__
        if torch.cuda.is_available():
            desc["gpu"] = torch.cuda.get_device_name(0)
            desc["gpu_mem_bytes"] = torch.cuda.get_device_properties(0).total_memory
    except ImportError:  # pragma: no cover
        pass
    try:
        flags = next(l for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("flags"))
        desc["cpu_flags"] = sorted(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
                                   if f in flags.split())
    except (OSError, StopIteration):
        pass
    try:
        mem = next(l for l in Path("/proc/meminfo").read_text().splitlines() if l.startswith("MemTotal"))
        desc["mem_bytes"] = int(mem.split()[1]) * 1024
    except (OSError, StopIteration, ValueError):
        pass
    return desc


def _umask() -> int:
    """The process's umask, read without changing it (os.umask sets it, for every thread);
    0o022 where /proc does not say."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def machine_key(desc: dict[str, Any] | None = None) -> str:
    d = desc or machine_description()
    parts = [d.get("cpu", "cpu"), str(d.get("logical_cpus", "")), d.get("gpu", "nogpu")]
    return re.sub(r"[^A-Za-z0-9]+", "-", "-".join(parts)).strip("-").lower()[:120]


def default_cache_path() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "writescope" / f"profile-{machine_key()}.json"


def load_or_calibrate(path: str | os.PathLike | None = None, quick: bool = True,
                      model_config=None, log=None) -> HardwareProfile:
    """The profile the engine plans with.

    ``path`` (or ``$WRITESCOPE_PROFILE``) names a saved profile, which must exist. Otherwise the
    cached profile of this machine (``~/.cache/writescope/profile-<machine>.json``) is used; if
    there is none, it is from another version, or it lacks ``model_config``'s attention family
    or expert shape, a quick calibration of what is missing runs and the cache is updated. A
    cached profile whose calibration did not time every CPU attention variant this build has
    (a new kernel variant since) is measured again.
    """
    path = path or os.environ.get("WRITESCOPE_PROFILE")
    if path:
        return HardwareProfile.load(path)
    from .calibrate import calibrate
    from .roofline import attn_family
    cache = default_cache_path()
    cached = None
    if cache.exists():
        try:
            cached = HardwareProfile.load(cache)
        except ValueError:
            cached = None  # stale or broken cache: measure again
    if cached is not None and _new_cpu_variants(cached):
        cached = None  # its variant choices predate a kernel variant this build has
    if cached is not None and (model_config is None or (
            attn_family(model_config) in cached.cpu_attn
            and expert_key(model_config.hidden_size, model_config.moe_intermediate_size)
            in cached.cpu_expert)):
        return cached
    prof = calibrate(quick=quick, models=[model_config] if model_config is not None else None,
                     log=log)
    if cached is not None:  # keep what the cache knew about other models
        for name in ("cpu_attn", "device_attn", "cpu_expert"):
            setattr(prof, name, {**getattr(cached, name), **getattr(prof, name)})
    try:
        prof.save(cache)
    except OSError:
        pass  # a read-only home still runs, just without the cache
    return prof


def _new_cpu_variants(p: HardwareProfile) -> list[str]:
    """CPU attention variants this build can run that ``p``'s calibration did not time."""
    from ..attention import cpu
    if os.environ.get("WRITESCOPE_CPU_ATTN_ISA", "auto") != "auto" or not cpu.available():
        return []
    return [v for v in cpu.isas() if v not in p.cpu_attn_variants]


def load_or_default(path: str | os.PathLike | None = None, model_config=None,
                    log=None) -> HardwareProfile:
    """What the engine calls at start-up: ``path`` if given, else ``$WRITESCOPE_PROFILE``, else
    this machine's cached profile, else a quick calibration (cached). Pass ``model_config`` so
    its attention family and expert shape are measured (otherwise the reference models' are)."""
    return load_or_calibrate(path, quick=True, model_config=model_config, log=log)
