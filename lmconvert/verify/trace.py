"""Where the two implementations can be compared inside a forward pass, and recording them.

A point is a module output that both sides compute: every module of a block that owns weights
(norms, q/k/v/o, the MLP projections), each block's output, the embedding output (the first
block's input) and the final norm's output. Points carry canonical names (`layers.3.attn.k`,
`layers.3` for block 3's output); the transformers module behind each is found through the
family's tensor table, which already pairs `layers.{}.attn.o.weight` with
`model.layers.{}.self_attn.o_proj.weight`, so no family needs its own localization code.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from lmconvert.arch import ArchConfig, Decoder
from lmconvert.arch.shapes import parameter_shapes
from lmconvert.mappings.errors import MappingError
from lmconvert.mappings.tables.table import TensorTable

EMBED, FINAL = "embed", "final_norm"


@dataclass
class Trace:
    """One forward pass: its logits and its points, in the order they were computed, in our
    layout (`layouts.py`); `problems` names the points that could not be put in it, and why."""

    logits: torch.Tensor
    points: dict[str, torch.Tensor] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)


def block_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(canonical name, module) for every weight-owning module inside the blocks, in the order a
    block declares them (the recorder keeps the order they actually run in). A module marked
    `one_point` (a mixture's experts, which transformers computes as one module) is one point, and
    the modules inside it are none; one marked `uncalled` (a short convolution's, run through
    F.conv1d over its state on both sides) has no output, so is none either."""
    found: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if not name.startswith("layers.") or any(name.startswith(f"{whole}.") for whole, m in found
                                                 if getattr(m, "one_point", False)):
            continue
        if getattr(module, "uncalled", False):  # its owner reads its weights and never calls it: no output
            continue
        if name.count(".") == 1:  # a block itself (Gemma 4's owns its layer scalar): its output is `layers.{i}`
            continue
        if getattr(module, "one_point", False) or any(True for _ in module.parameters(recurse=False)):
            found.append((name, module))
    return found


def point_modules(arch: ArchConfig) -> dict[str, str]:
    """{point name: the canonical weight name that identifies its module (its first own, else its
    first part's)}, without allocating."""
    with torch.device("meta"):
        model = Decoder(arch)
    return {name: f"{name}.{next(iter(dict(module.named_parameters())))}" for name, module in block_modules(model)}


def layer_of(point: str) -> int | None:
    parts = point.split(".")
    return int(parts[1]) if parts[0] == "layers" and len(parts) > 1 and parts[1].isdigit() else None


def sublayer_of(point: str) -> str:
    """"attn.k" for `layers.3.attn.k`, "output" for a block's output, the point itself otherwise."""
    layer = layer_of(point)
    if layer is None:
        return point
    rest = point.split(".", 2)[2:] if point.count(".") >= 2 else []
    return rest[0] if rest else "output"


class Recorder:
    """Forward hooks that keep a CPU copy of the first output of each named module. A module
    called more than once per forward has no single output to compare and is left out."""

    def __init__(self) -> None:
        self.points: dict[str, torch.Tensor] = {}
        self.repeated: set[str] = set()
        self._handles: list[torch.utils.hooks.RemovableHandle] = []

    def keep(self, name: str, value: torch.Tensor) -> None:
        if name in self.points:
            self.repeated.add(name)
            return
        self.points[name] = value.detach().to("cpu", copy=True)

    def output_of(self, name: str, module: nn.Module, index: int = 0) -> None:
        """The module's output, or entry `index` of the tuple (or list: GPT's) it returns."""
        def hook(_module: nn.Module, _args: tuple, output: object) -> None:
            self.keep(name, output[index] if isinstance(output, (tuple, list)) else output)
        self._handles.append(module.register_forward_hook(hook))

    def input_of(self, name: str, module: nn.Module) -> None:
        def hook(_module: nn.Module, args: tuple) -> None:
            self.keep(name, args[0])
        self._handles.append(module.register_forward_pre_hook(hook))

    def experts_alone(self, name: str, module: nn.Module, alone: Callable[[nn.Module, tuple, int], torch.Tensor],
                      n_experts: int) -> None:
        """Before a mixture's experts run, each expert's own output on every token of their input,
        as `{name}.{e}`: `alone(module, args, e)` computes it (each side calls its own module its
        own way). Recorded ahead of the experts' sum, so that one broken expert is the first
        failure and is named."""
        def hook(_module: nn.Module, args: tuple) -> None:
            for e in range(n_experts):
                self.keep(f"{name}.{e}", alone(module, args, e))
        self._handles.append(module.register_forward_pre_hook(hook))

    def result(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.points.items() if k not in self.repeated}

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


@contextmanager
def recording(model: nn.Module) -> Iterator[Recorder]:
    """Hooks on a canonical Decoder (or a streamed one's skeleton): embedding output, every
    weight-owning module of every block, each block's output, the final norm's output."""
    recorder = Recorder()
    try:
        if len(model.layers):
            recorder.input_of(EMBED, model.layers[0])
        for name, module in block_modules(model):
            if getattr(module, "one_point", False):  # a mixture's experts: also each one alone
                recorder.experts_alone(name, module, lambda m, args, e: m[e](args[0]), len(module))
            recorder.output_of(name, module)
        for i, block in enumerate(model.layers):
            recorder.output_of(f"layers.{i}", block)
        # what the LM head reads: after OPT-350m's project_out, where transformers' last hidden state is
        recorder.output_of(FINAL, model.project_out if getattr(model, "project_out", None) is not None
                           else model.final_norm)
        yield recorder
    finally:
        recorder.close()


@torch.no_grad()
def our_trace(model: nn.Module, forward: Callable[[torch.Tensor], torch.Tensor], ids: torch.Tensor) -> Trace:
    """Run `forward` (the Decoder itself, or a streamed forward over the same modules) with hooks."""
    with recording(model) as recorder:
        logits = forward(ids)
    return Trace(logits, recorder.result())


def _module_path(weight: str) -> str:
    """The module holding a weight; for a tensor stored one per row (StableLM's
    `q_layernorm.norms.{}.weight`, a `{}` left in its name) the module that runs the rows' modules,
    the one above the list holding them, whose output is the whole value."""
    if ".{}." in weight:
        return weight.split(".{}.")[0].rsplit(".", 1)[0]
    return weight.rsplit(".", 1)[0]


def bias_outside(table: TensorTable, weight: str, shapes: dict[str, tuple[int, ...]]) -> bool:
    """Whether the point's bias is stored outside the module holding its weight, so that no
    transformers module outputs the point: GPT-NeoX-Japanese's last-layer `attention.dense_bias`,
    added after `dense` by `bias_dropout_add`. (The block's output, a point of its own, includes it.)"""
    bias = f"{weight.removesuffix('.weight')}.bias"
    if not weight.endswith(".weight") or bias not in shapes:
        return False
    try:
        return {_module_path(n) for n in table.stored_names(bias)} != \
            {_module_path(n) for n in table.stored_names(weight)}
    except MappingError:
        return False


def _common_prefix(paths: list[str]) -> str:
    parts = [p.split(".") for p in paths]
    return ".".join(os.path.commonprefix(parts))


def resolve(names: set[str], path: str, table: TensorTable) -> str | None:
    """The module path as it exists among `names`: the table's own, or under one of its
    alternative prefixes (multimodal wrappers keep the text model under `model.language_model.`), or
    `model.` for a stored `backbone.`."""
    candidates = [path]
    if path.startswith("model."):
        candidates += [prefix + path[len("model."):] for prefix in table.hf_prefixes]
    if path.startswith("backbone."):  # the Hub's names, transformers' modules under `model.` (Nemotron-H)
        candidates.append("model." + path[len("backbone."):])
    return next((c for c in candidates if c in names), None)


def hf_final_norm(root: nn.Module, table: TensorTable) -> str | None:
    """transformers' module holding the final norm's weight, where the table names one and the model has it."""
    try:
        stored, _ = table.to_hf_name("final_norm.weight")
    except MappingError:
        return None
    return resolve({name for name, _ in root.named_modules()}, _module_path(stored), table)


def hf_point_modules(root: nn.Module, arch: ArchConfig, table: TensorTable,
                     hidden: Collection[str] = ()) -> dict[str, str]:
    """{point name: transformers module path} for the block modules, from the tensor table, and
    for every decoder layer: the longest module path its modules share. Points the table cannot
    name, or whose module transformers does not have, are simply absent; so are the point kinds
    `hidden` names (those verify declares beyond its reach, `layouts.unobserved`)."""
    names = {name for name, _ in root.named_modules()}
    shapes = parameter_shapes(arch)
    found: dict[str, str] = {}
    by_layer: dict[int, list[str]] = {}
    for point, weight in point_modules(arch).items():
        if sublayer_of(point) in hidden:
            continue
        try:
            _, step = table.to_hf_name(weight)
        except MappingError:  # a tensor this family does not name is simply not a point
            continue
        if getattr(step, "interleaves", False):  # q, k or v of a projection fused per KV group (NeoX, BLOOM,
            continue  # Falcon): no transformers module computes it, nor a slice of one
        if bias_outside(table, weight, shapes):
            continue
        # the name export writes, then any other the table reads (transformers 5's fused experts)
        paths = (resolve(names, _module_path(hf_weight), table) for hf_weight in table.stored_names(weight))
        path = next((p for p in paths if p is not None), None)
        if path is not None and sublayer_of(point) == "mlp.experts" and ".experts." in f"{path}.":
            # the module computing all experts is transformers' `experts` (DBRX's keeps its weights in a child)
            path = path[:f"{path}.".rindex(".experts.") + len(".experts")]
        if path is not None:
            found[point] = path
            by_layer.setdefault(layer_of(point), []).append(path)
    for point in [p for p in found if sublayer_of(p) == "attn"]:
        # the attention's own tensors may sit in a module under it (JetMoE's output bias, in its never-called
        # `experts`): its point is the attention's output, the module every other attention point shares
        inside = [path for p, path in found.items() if layer_of(p) == layer_of(point) and sublayer_of(p) != "attn"
                  and sublayer_of(p).startswith("attn.")]
        prefix = _common_prefix(inside) if len(inside) > 1 else ""
        if prefix in names and prefix:
            found[point] = prefix
    for i in range(arch.n_layers):
        paths = by_layer.get(i, [])
        prefix = _common_prefix(paths) if len(paths) > 1 else ""
        if prefix and prefix in names and prefix not in paths:
            found[f"layers.{i}"] = prefix
    return found
