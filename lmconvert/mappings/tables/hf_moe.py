"""The mixture-of-experts config keys and tensor names shared by the MoE families (Mixtral,
Qwen2-MoE, Qwen3-MoE, OLMoE): each family states which keys it reads and what it fixes.

Tensors come in two layouts: the Hub's, one tensor per expert and projection
(`experts.{e}.gate_proj.weight`), which transformers 5 still writes with `save_pretrained` and
reads through its conversion mapping, and the layout transformers 5 holds in memory and writes
with `save_pretrained(save_original_format=False)`: per layer one fused `experts.gate_up_proj`
[experts, 2 * width, hidden] (gate rows, then up rows) and `experts.down_proj` [experts, hidden,
width]. Both are read; export writes the Hub's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lmconvert.arch import ArchConfig, MoeConfig

from ..errors import MappingError
from .config_table import DEFAULT, Entry
from .hf_config import HfConfig, Key
from .table import Rule
from .transforms import Unstack


def experts(count: Key, top_k: Key, *, width: Key | None = None, norm_key: Key | None = None,
            shared_width: Key | None = None, sparse_step: Key | None = None, dense_list: Key | None = None,
            count_legacy: Key | None = None, aux_default: float | None = None, **fixed: Any) -> Entry:
    """One row: the experts' count, top-k and width (`width`, or the dense d_ff when the family's
    experts are as wide as its FFN, as in Mixtral and OLMoE), the renormalisation switch, the shared
    expert's width, and which layers stay dense (`decoder_sparse_step`, `mlp_only_layers`);
    `count_legacy`: another spelling of the count, read when the count's own is absent
    (Qwen3-MoE's Hub files say num_experts; transformers writes num_local_experts). `aux_default`:
    the family's default `router_aux_loss_coef`, which its training loss adds times the
    load-balancing loss when `output_router_logits` is true. `fixed` are the MoeConfig fields the
    family hard-codes."""
    aux = (Key("output_router_logits", bool, False), Key("router_aux_loss_coef", float, aux_default,
                                                           bound="non_negative")) if aux_default is not None else ()
    keys = tuple(k for k in (count, top_k, width, norm_key, shared_width, sparse_step, dense_list, count_legacy, *aux)
                 if k is not None)

    def n_experts(hf: HfConfig) -> int:
        if count_legacy is not None and not hf.stated(count.name) and hf.stated(count_legacy.name):
            return hf.get(count_legacy.name)
        return hf.get(count.name)

    def read(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
        n_layers, step = fields["n_layers"], hf.get(sparse_step.name) if sparse_step else 1
        listed = hf.get(dense_list.name) if dense_list else None
        listed = [] if listed is None else listed
        if any(isinstance(i, bool) or not isinstance(i, int) for i in listed):
            raise MappingError(f"config.json: {dense_list.name}={listed} should list layer indices")  # type: ignore[union-attr]
        dense = [i for i in range(n_layers) if i in listed or (i + 1) % step]
        settings = dict(fixed)
        if norm_key is not None:
            settings["norm_topk"] = hf.get(norm_key.name)
        if shared_width is not None:
            settings["d_shared"] = hf.get(shared_width.name)
        if aux and hf.get("output_router_logits"):
            settings["aux_loss"] = hf.get("router_aux_loss_coef")
        moe = MoeConfig(n_experts=n_experts(hf), top_k=hf.get(top_k.name),
                        d_expert=hf.get(width.name) if width else fields["d_ff"], dense_layers=tuple(dense),
                        **settings)
        return {"moe": moe}

    def write(cfg: ArchConfig) -> dict[str, Any]:
        moe = cfg.moe
        if moe is None:  # a dense model: the family cannot express it; say so through the lost field
            return {count.name: DEFAULT}
        out: dict[str, Any] = {count.name: moe.n_experts, top_k.name: moe.top_k}
        if width is not None:
            out[width.name] = moe.d_expert
        if norm_key is not None:
            out[norm_key.name] = moe.norm_topk
        if shared_width is not None:
            out[shared_width.name] = DEFAULT if moe.d_shared is None else moe.d_shared
        if aux:
            out.update(output_router_logits=bool(moe.aux_loss), router_aux_loss_coef=moe.aux_loss or DEFAULT)
        if sparse_step is not None:
            step = sparse_step_of(moe.dense_layers, cfg.n_layers)
            out[sparse_step.name] = step
            listed = [i for i in moe.dense_layers if (i + 1) % step == 0]
        else:
            listed = list(moe.dense_layers)
        if dense_list is not None:
            out[dense_list.name] = listed
        return out

    return Entry("experts", keys, read, write)


def sparse_step_of(dense: tuple[int, ...], n_layers: int) -> int:
    """The `decoder_sparse_step` that explains most of the dense layers (the rest are listed in
    `mlp_only_layers`), so that a file written with a step is written back with it."""
    def explained(step: int) -> set[int]:
        return {i for i in range(n_layers) if (i + 1) % step}

    fitting = [s for s in range(1, n_layers + 1) if explained(s) <= set(dense)]
    return max(fitting, key=lambda s: (len(explained(s)), -s))


def expert_rules(prefix: str, names: tuple[str, str, str], router: str) -> tuple[Rule, ...]:
    """The Hub's per-expert names under `model.layers.{}.{prefix}` (`names`: gate, up, down as
    the family spells them) and the router's, then the fused names transformers 5 holds."""
    gate, up, down = names
    hub = tuple(Rule(f"model.layers.{{}}.{prefix}.experts.{{}}.{stored}.weight",
                     f"layers.{{}}.mlp.experts.{{}}.{ours}.weight")
                for stored, ours in ((gate, "gate"), (up, "up"), (down, "down")))
    rules = (Rule(f"model.layers.{{}}.{prefix}.{router}.weight", "layers.{}.mlp.router.weight"), *hub)
    if prefix != "mlp":  # transformers 5 renames the block to `mlp` (Mixtral's block_sparse_moe)
        rules += (Rule("model.layers.{}.mlp.gate.weight", "layers.{}.mlp.router.weight"),)
    return rules + FUSED_RULES


# transformers 5's own layout (conversion_mapping.py: MergeModulelist then Concatenate(dim=1))
FUSED_RULES = (
    Rule("model.layers.{}.mlp.experts.gate_up_proj", "layers.{}.mlp.experts.{}.gate.weight", Unstack(part=0, parts=2)),
    Rule("model.layers.{}.mlp.experts.gate_up_proj", "layers.{}.mlp.experts.{}.up.weight", Unstack(part=1, parts=2)),
    Rule("model.layers.{}.mlp.experts.down_proj", "layers.{}.mlp.experts.{}.down.weight", Unstack()),
)


def dense_layers(hf: HfConfig, n: int, first_dense: int) -> tuple[int, ...]:
    """The layers transformers builds dense (the others a mixture of experts): where
    `mlp_layer_types` says "dense" (else "sparse"), or without it the first `first_dense`."""
    types = hf.get("mlp_layer_types")
    if types is None:
        first = min(first_dense, n)
        types = ["dense"] * first + ["sparse"] * (n - first)
    if len(types) != n or not set(types) <= {"dense", "sparse"}:
        raise MappingError(f"config.json: mlp_layer_types={types!r}: needs \"dense\" or \"sparse\" for each of the "
                           f"num_hidden_layers={n} layers")
    return tuple(i for i, kind in enumerate(types) if kind == "dense")


def mlp_layer_types_to_hf(cfg: ArchConfig, keys: tuple[Key, ...],
                          values: Callable[[MoeConfig], dict[str, Any]]) -> dict[str, Any]:
    """`mlp_layer_types` by name, and the mixture's keys (`values`); a dense model writes every other key of
    `keys` as its default. What the family cannot express reads back otherwise and is refused by name."""
    moe = cfg.moe
    types = ["sparse" if moe is not None and moe.sparse(i) else "dense" for i in range(cfg.n_layers)]
    if moe is None:
        return {"mlp_layer_types": types, **{k.name: DEFAULT for k in keys if k.name != "mlp_layer_types"}}
    return {"mlp_layer_types": types, **values(moe)}


def grouped_router_to_hf(count: str) -> Callable[[MoeConfig], dict[str, Any]]:
    """DeepSeek-V3's router keys as Beam and MiMo-V2-Flash write them beside `mlp_layer_types` (`count`: the
    family's name for the experts' count)."""
    return lambda moe: {count: moe.n_experts, "num_experts_per_tok": moe.top_k, "moe_intermediate_size": moe.d_expert,
                        "norm_topk_prob": moe.norm_topk, "n_group": moe.n_group, "topk_group": moe.topk_group,
                        "routed_scaling_factor": moe.scale}
