"""Tensor parallelism of the canonical decoder on `torch.distributed.tensor.parallel`, one rank per process.

The plan is Megatron's, stated per module and applied with `parallelize_module`:

- q, k, v, gate, up (and MLA's q / q_b and kv_b) column-wise: each rank computes its own heads,
  its own slice of the MLP's hidden width; o and down row-wise: each rank's partial sums are
  all-reduced. Two collectives per block, none inside attention.
- the embedding is split over the vocabulary (each rank looks up its rows, an all-reduce sums them)
  and so is the LM head (each rank scores its rows, an all-gather joins the logits); tied
  embeddings share the one sliced weight.
- norms, learned positions, the OPT projections and MLA's low-rank down-projections (q_a, kv_a,
  whose output every head reads) are replicated: small, and every rank needs all of it.
- KV heads are split when their count divides by the ranks. Otherwise, when the ranks divide by it
  (MQA's single head, Llama-3-70B's 8 on 16 ranks), each rank keeps the one KV head its query heads
  read: plain local tensors, the KV projection replicated over the ranks that share that head.

Each rank reads only its slice of each weight (`formats.slices`), so none holds a whole sharded
weight; the replicated ones above are whole on every rank. What a plan cannot split exactly is
refused with one line (`refusals`): per-head ALiBi slopes and T5 relative biases (their head
index is global), QK norm over the whole projection (its statistics span every head), a head
count or hidden width the ranks do not divide. Per-head QK norm weights (Cohere), attention
sinks (gpt-oss) and the attention output gate's rows (AFMoE) go with their heads. A mixture of
attention heads (JetMoE) splits every expert's q and o by the kv heads, as q and o.

A mixture of experts splits each expert's MLP like the dense one (its hidden width over the ranks,
two collectives per expert that runs) and replicates the router, so every rank picks the same
experts. Expert parallelism (whole experts per rank, fewer collectives) is not built.

Attention modules are told their local head counts through a per-rank copy of the ArchConfig
(`n_heads / N`), so the arch code runs unchanged and knows nothing of the ranks.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, parallelize_module

from lmconvert.arch import ArchConfig, ConfigError, Decoder
from lmconvert.arch.moe import kept_in_fp32
from lmconvert.formats.checkpoint import Checkpoint
from lmconvert.formats.slices import SliceReader

from .launch import backend, launched


@dataclass(frozen=True)
class Style:
    """How a parallelized module's parameters are placed, and the torch style that wires its inputs
    and outputs."""

    placements: dict[str, Placement]
    parallel: Callable[[], ParallelStyle]


STYLES: dict[str, Style] = {
    "col": Style({"weight": Shard(0), "bias": Shard(0)}, ColwiseParallel),
    "row": Style({"weight": Shard(1), "bias": Replicate()}, RowwiseParallel),
    "vocab": Style({"weight": Shard(0)}, lambda: RowwiseParallel(input_layouts=Replicate())),
    "head": Style({"weight": Shard(0), "bias": Shard(0)}, lambda: ColwiseParallel(output_layouts=Replicate())),
}


@dataclass
class Plan:
    """One rank's plan. `styles`: module path -> STYLES key. `groups`: module path -> the rows of
    its weight (and bias) this rank keeps as plain tensors (one KV head shared by several ranks; the
    rows of per-head QK norm weights).
    `points`: module path -> (dim of its output that is split, the ranks whose pieces make the whole
    output, in order), for modules whose output is a slice per rank (verify gathers them)."""

    size: int
    rank: int
    local_arch: ArchConfig
    styles: dict[str, str] = field(default_factory=dict)
    groups: dict[str, tuple[int, int]] = field(default_factory=dict)
    points: dict[str, tuple[int, tuple[int, ...]]] = field(default_factory=dict)


def refusals(arch: ArchConfig, size: int) -> list[str]:
    """Why `arch` cannot be split over `size` ranks (empty when it can)."""
    checks = [  # Zamba's shared blocks by name, then a mixer: an all-mixer model's attention fields are placeholders
        (arch.shared_blocks is not None, f"the shared transformer blocks (Zamba's, each called by several layers) "
                                         f"have no tensor-parallel plan, nor its {arch.mixer} layers"),
        (bool(arch.layers_mixed_by("mixer")), f"the {arch.mixer} mixer layers have no tensor-parallel plan"),
        (arch.attention not in ATTENTION_PLANS,
         f"attention kind {arch.attention!r} has no tensor-parallel plan (known: {', '.join(ATTENTION_PLANS)})"),
        (arch.n_heads % size != 0, f"n_heads={arch.n_heads} does not divide by {size} ranks"),
        (arch.n_kv_heads % size != 0 and size % arch.n_kv_heads != 0,
         f"n_kv_heads={arch.n_kv_heads} neither divides by {size} ranks nor divides them"),
        (arch.d_ff % size != 0, f"d_ff={arch.d_ff} does not divide by {size} ranks"),
        (arch.moe is not None and arch.moe.d_expert % size != 0,
         f"the experts' width {arch.moe and arch.moe.d_expert} does not divide by {size} ranks"),
        (arch.moe is not None and (arch.moe.d_shared or 0) % size != 0,
         f"the shared expert's width {arch.moe and arch.moe.d_shared} does not divide by {size} ranks"),
        ("alibi" in arch.layer_positions, "ALiBi's per-head slopes are indexed by the global head"),
        ("relative" in arch.layer_positions, "the relative position bias is indexed by the global head"),
        (arch.qk_norm == "projection", "QK norm over the whole projection needs every head's values"),
        (arch.sub_norms, "the sub-norms (BitNet's) normalise over every head and the whole MLP width"),
        (arch.attention == "head_mixture" and arch.n_kv_heads % size != 0,
         f"n_kv_heads={arch.n_kv_heads} does not divide by {size} ranks: a mixture of attention heads splits each "
         "expert's queries by the kv head they read"),
        # Gemma 4's features, each refused by name
        (arch.global_head_dim is not None or arch.global_kv_heads is not None,
         "per-layer head geometry (the global layers' own head_dim and KV heads) has no tensor-parallel plan"),
        (arch.k_eq_v != "none", "K = V layers (v taken from k's projection) have no tensor-parallel plan"),
        (bool(arch.kv_shared_layers), "cross-layer KV sharing has no tensor-parallel plan"),
        (arch.layer_scalar, "the per-layer output scalar has no tensor-parallel plan"),
        # MiMo-V2-Flash's and Laguna's, each refused by name
        (arch.v_head_dim is not None, "values of their own width (v_head_dim) have no tensor-parallel plan"),
        (arch.layer_heads is not None, "query heads that differ by layer have no tensor-parallel plan"),
        (arch.sink_layers != "all", "sinks on the sliding layers only have no tensor-parallel plan"),
        (arch.attn_output_gate == "projection_head", "a gate per head (Laguna's g_proj) has no tensor-parallel plan"),
        # Gemma 3n's
        (arch.altup is not None, "AltUp's residual streams have no tensor-parallel plan"),
        (arch.ple is not None, "per-layer embeddings have no tensor-parallel plan"),
        (arch.laurel_rank is not None, "the LAuReL branch has no tensor-parallel plan"),
        (arch.gate_sparsity is not None, "sparse gates take statistics over the whole FFN width"),
        (arch.d_ff_layers is not None, "FFN widths per layer have no tensor-parallel plan"),
    ]
    return [why for wrong, why in checks if wrong]


def _rows(n: int, size: int, rank: int) -> tuple[int, int]:
    step = n // size
    return rank * step, (rank + 1) * step


def _standard(arch: ArchConfig, plan: Plan, prefix: str) -> None:
    size, rank = plan.size, plan.rank
    everyone = tuple(range(size))
    plan.styles.update({f"{prefix}.q": "col", f"{prefix}.o": "row"})
    plan.points[f"{prefix}.q"] = (-1, everyone)
    if arch.n_kv_heads % size == 0:
        plan.styles.update({f"{prefix}.k": "col", f"{prefix}.v": "col"})
        kv_ranks = everyone
        kv_heads = _rows(arch.n_kv_heads, size, rank)
    else:  # the ranks divide by the KV heads: each keeps the one its query heads read
        share = size // arch.n_kv_heads
        head = rank // share
        for name in ("k", "v"):
            plan.groups[f"{prefix}.{name}"] = (head * arch.head_dim, (head + 1) * arch.head_dim)
        kv_ranks, kv_heads = tuple(range(0, size, share)), (head, head + 1)
    plan.points.update({f"{prefix}.k": (-1, kv_ranks), f"{prefix}.v": (-1, kv_ranks)})
    # Qwen3-Next's gate sits in q's rows beside each head's query: split with them. AFMoE's: its rows, as q's
    if arch.attn_output_gate in ("projection", "projection_head_bias"):
        plan.styles[f"{prefix}.out_gate"] = "col"
        plan.points[f"{prefix}.out_gate"] = (-1, everyone)
    # gpt-oss: a sink per head; Beam: a gate bias per head; the rank's heads' (the attention's own tensors)
    if arch.attn_sinks or arch.attn_output_gate == "projection_head_bias":
        plan.groups[prefix] = _rows(arch.n_heads, size, rank)
    if arch.qk_norm == "head":  # its output is (B, T, heads, D): the rank's heads; after RoPE (B, heads, T, D)
        dim = -3 if arch.qk_norm_after_rope else -2
        plan.points.update({f"{prefix}.q_norm": (dim, everyone), f"{prefix}.k_norm": (dim, kv_ranks)})
    if arch.qk_norm_weight == "per_head":  # Cohere: a weight row per head, the rank's heads' rows
        plan.groups[f"{prefix}.q_norm"] = _rows(arch.n_heads, size, rank)
        plan.groups[f"{prefix}.k_norm"] = kv_heads


def _latent(arch: ArchConfig, plan: Plan, prefix: str) -> None:
    everyone = tuple(range(plan.size))
    q = "q" if arch.attention_settings.q_lora_rank is None else "q_b"
    plan.styles.update({f"{prefix}.{q}": "col", f"{prefix}.kv_b": "col", f"{prefix}.o": "row"})
    plan.points.update({f"{prefix}.{q}": (-1, everyone), f"{prefix}.kv_b": (-1, everyone)})


def _mixture(arch: ArchConfig, plan: Plan, prefix: str) -> None:
    """A mixture of attention heads (JetMoE's): every expert's q column-wise and o row-wise, by the kv heads
    (each rank computes its kv heads' queries of every chosen expert), k and v column-wise; the router and
    the output bias whole, so that every rank routes alike and adds the bias once, to the reduced sum."""
    everyone = tuple(range(plan.size))
    for e in range(arch.attention_settings.n_experts):  # each expert's q alone is a point of ours too (trace)
        plan.styles.update({f"{prefix}.q.{e}": "col", f"{prefix}.o.{e}": "row"})
        plan.points[f"{prefix}.q.{e}"] = (-1, everyone)
    plan.styles.update({f"{prefix}.k": "col", f"{prefix}.v": "col"})
    plan.points.update({f"{prefix}.{name}": (-1, everyone) for name in ("q", "k", "v")})


# ArchConfig.attention -> how its layers split
ATTENTION_PLANS: dict[str, Callable[[ArchConfig, Plan, str], None]] = {"standard": _standard, "latent": _latent,
                                                                     "head_mixture": _mixture}
# the kinds whose KV heads split as the query heads do (latent attention has one latent, its heads the queries')
KV_HEADS_SPLIT = ("standard", "head_mixture")


def check_split(arch: ArchConfig, size: int) -> None:
    """Refuse, in one line, a rank count that cannot split `arch`, naming the counts that can (up to
    the query heads, each of which one rank at least must hold). Pure arithmetic on the config: it
    runs before the process group, the reference or any weight."""
    problems = refusals(arch, size)
    if not problems:
        return
    fits = [n for n in range(2, arch.n_heads + 1) if not refusals(arch, n)]
    counts = ", ".join(map(str, fits[:-1])) + " or " * (len(fits) > 1) + "".join(map(str, fits[-1:]))
    instead = f"run with {counts} ranks, or on one process" if fits else \
        "run it on one process (without torchrun)"
    raise ConfigError(f"tensor parallelism over {size} ranks: {problems[0]}; {instead}")


def make_plan(arch: ArchConfig, size: int, rank: int) -> Plan:
    check_split(arch, size)
    kv = arch.n_kv_heads // size if arch.n_kv_heads % size == 0 else 1
    local = replace(arch, n_heads=arch.n_heads // size, n_kv_heads=kv if arch.attention in KV_HEADS_SPLIT
                    else arch.n_heads // size)
    plan = Plan(size, rank, local)
    sharded_vocab = arch.vocab_size % size == 0  # else the embedding and head stay whole (documented)
    if sharded_vocab:
        plan.styles["embed"] = "vocab"
    if arch.head_vocab % size == 0:  # the LM head's rows (the vocabulary's, or a narrower head's)
        plan.styles["lm_head"] = "head"
    for i in range(arch.n_layers):
        if arch.layer_mixers[i] == "attention":
            ATTENTION_PLANS[arch.attention](arch, plan, f"layers.{i}.attn")
        if arch.layer_ffns[i] == "none":
            continue
        mlp, moe = f"layers.{i}.mlp", arch.moe
        if moe is None or not moe.sparse(i):
            _mlp(arch, plan, mlp)
            continue
        for e in range(moe.n_experts):  # every expert split like a dense MLP; the router whole
            _mlp(arch, plan, f"{mlp}.experts.{e}")
        if moe.d_shared is not None:
            _mlp(arch, plan, f"{mlp}.shared")
    return plan


def _mlp(arch: ArchConfig, plan: Plan, prefix: str) -> None:
    everyone = tuple(range(plan.size))
    for name in ("gate", "up") if arch.gated else ("up",):
        plan.styles[f"{prefix}.{name}"] = "col"
        plan.points[f"{prefix}.{name}"] = (-1, everyone)
    plan.styles[f"{prefix}.down"] = "row"


def device_mesh(size: int | None = None) -> DeviceMesh:
    """A one-dimensional mesh over every rank, starting the process group from torchrun's
    environment if nobody has. On GPUs each rank takes the device of its local rank."""
    if not dist.is_initialized():
        if not launched():
            raise ConfigError(f"tp={size if size is not None else True}: tensor parallelism runs one process per "
                              "rank; start this program with torchrun --nproc-per-node N (or init the process group)")
        dist.init_process_group(backend())
    world = dist.get_world_size()
    if size is not None and size != world:
        raise ConfigError(f"tp={size}, but {world} ranks were launched; pass tp={world} or launch {size}")
    kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", dist.get_rank() % torch.cuda.device_count())))
    return init_device_mesh(kind, (world,))


def _placed(reader: SliceReader, name: str, shape: torch.Size, placement: Placement, mesh: DeviceMesh,
            rank: int, cast: Callable[[torch.Tensor], torch.Tensor]) -> DTensor:
    """The rank's slice of `name` as a DTensor of the whole shape; no communication."""
    if isinstance(placement, Shard):
        start, stop = _rows(shape[placement.dim], mesh.size(), rank)
        local = reader.read(name, placement.dim, start, stop)
    else:
        local = reader.read(name)
    stride = torch.empty(shape, device="meta").stride()
    return DTensor.from_local(cast(local), mesh, [placement], run_check=False, shape=shape, stride=stride)


@dataclass
class ParallelInfo:
    """What a tensor-parallel Decoder carries (as `model.tensor_parallel`): its plan, and what the
    reads cost (`largest_read` bytes at most at once; `whole_reads`: tensors read whole)."""

    plan: Plan
    mesh: DeviceMesh
    largest_read: int
    whole_reads: list[str]


def load_parallel(checkpoint: Checkpoint, mesh: DeviceMesh, dtype: torch.dtype | None = None,
                  attention: str = "sdpa") -> Decoder:
    """This rank's share of the canonical Decoder: every rank calls it with the same arguments."""
    arch, rank = checkpoint.arch, mesh.get_local_rank()
    plan = make_plan(arch, mesh.size(), rank)
    device = torch.device("cpu") if mesh.device_type == "cpu" else torch.device("cuda", torch.cuda.current_device())
    with torch.device("meta"):
        model = Decoder(arch)
        if arch.tie_embeddings and "lm_head" in plan.styles:  # the LM head is the embedding, sliced the same way
            model.lm_head = nn.Linear(arch.embed_dim, arch.vocab_size, bias=arch.lm_head_bias)
    for block in model.layers:  # attention reads its head counts from its config: the local ones
        if block.attn is not None:
            block.attn.cfg = plan.local_arch
    fp32 = kept_in_fp32(model)
    with SliceReader(checkpoint) as reader:
        for path, module in model.named_modules():
            for pname, param in list(module.named_parameters(recurse=False)):
                name = f"{path}.{pname}" if path else pname
                if name == "lm_head.weight" and arch.tie_embeddings:
                    module.weight = model.embed.weight
                    continue

                def cast(t: torch.Tensor, name: str = name) -> torch.Tensor:
                    return t.to(device=device, dtype=torch.float32 if name in fp32 else dtype or t.dtype)

                if path in plan.styles:
                    placement = STYLES[plan.styles[path]].placements[pname]
                    value = _placed(reader, name, param.shape, placement, mesh, rank, cast)
                elif path in plan.groups:
                    value = cast(reader.read(name, 0, *plan.groups[path]))
                    if isinstance(module, nn.Linear):
                        module.out_features = value.shape[0]
                else:
                    value = cast(reader.read(name))
                module.register_parameter(pname, nn.Parameter(value, requires_grad=False))
        info = ParallelInfo(plan, mesh, reader.largest, list(reader.whole_reads))
    parallelize_module(model, mesh, {path: STYLES[style].parallel() for path, style in plan.styles.items()})
    model.tensor_parallel = info
    return model.set_attention(attention).eval()


def local_bytes(model: nn.Module) -> int:
    """Bytes of parameters this rank holds: a DTensor's local shard, each shared tensor once."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        local = p.to_local() if isinstance(p, DTensor) else p
        if local.data_ptr() not in seen:
            seen.add(local.data_ptr())
            total += local.nbytes
    return total


def gather_points(model: nn.Module, points: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Module outputs recorded on each rank, made whole where each rank computed a slice: every rank
    calls it, in the same order, with the same names."""
    info: ParallelInfo = model.tensor_parallel
    group = info.mesh.get_group()
    device = info.mesh.device_type
    whole: dict[str, torch.Tensor] = {}
    for name, value in points.items():
        split = info.plan.points.get(name)
        if split is None:
            whole[name] = value
            continue
        dim, ranks = split
        pieces = [torch.empty_like(value, device=device) for _ in range(info.plan.size)]
        dist.all_gather(pieces, value.to(device).contiguous(), group=group)
        whole[name] = torch.cat([pieces[r] for r in ranks], dim=dim).to(value.device)
    return whole
