"""The transformers side of a comparison. transformers (and accelerate) are imported here and
nowhere else, and only inside the functions that need them, so that a check against a golden
file runs where transformers is not installed."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from lmconvert.arch import ArchConfig
from lmconvert.formats.errors import InputError
from lmconvert.formats.source import Loadable
from lmconvert.mappings import BY_MODEL_TYPE
from lmconvert.mappings.tables.points import Parallel, Returned, Summed
from lmconvert.mappings.tables.table import TensorTable

from .layouts import EXPERT, PointLayouts, unobserved
from .spread import spread_memory
from .trace import EMBED, FINAL, Recorder, Trace, hf_final_norm, hf_point_modules, sublayer_of


def accelerate_device(device: str) -> int | str:
    """The key accelerate's maps use for `device`: a GPU's index, or "cpu"."""
    target = torch.device(device)
    if target.type == "cuda":
        return target.index if target.index is not None else torch.cuda.current_device()
    return target.type


def memory_map(device: str, max_memory: int) -> dict[int | str, int]:
    """accelerate's `max_memory`: the budget on the compute device, the rest offloaded to disk
    (on a GPU, first to CPU RAM under the same budget)."""
    compute = accelerate_device(device)
    return {compute: max_memory, "cpu": max_memory} if compute != "cpu" else {"cpu": max_memory}


def auto_class(config: object) -> type:
    """transformers' auto class that builds the whole model for a config: AutoModelForCausalLM,
    or for a multimodal wrapper it does not list (Mistral3ForConditionalGeneration),
    AutoModelForMultimodalLM, whose logits on a text-only input are its text decoder's."""
    from transformers import AutoModelForCausalLM, AutoModelForMultimodalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_FOR_MULTIMODAL_LM_MAPPING

    kind = type(config)
    if kind not in MODEL_FOR_CAUSAL_LM_MAPPING and kind in MODEL_FOR_MULTIMODAL_LM_MAPPING:
        return AutoModelForMultimodalLM
    return AutoModelForCausalLM


def meta_model(reference: Loadable, dtype: torch.dtype) -> torch.nn.Module:
    """transformers' model for `reference` on the meta device: its modules and sizes, no weights."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(reference.where), **reference.kwargs)
    with torch.device("meta"):
        return auto_class(config).from_config(config, dtype=dtype, attn_implementation="eager")


def offload_map(reference: Loadable, dtype: torch.dtype, device: str, max_memory: int) -> dict[str, int | str]:
    """Where each module of transformers' model lives under the budget, on one compute device."""
    from transformers.integrations.accelerate import get_max_memory, infer_auto_device_map

    model = meta_model(reference, dtype)
    placed = infer_auto_device_map(model, max_memory=get_max_memory(memory_map(device, max_memory)),
                                   no_split_module_classes=model._no_split_modules, clean_result=False)
    return computing_on(placed, model, accelerate_device(device))


def computing_on(placed: dict[str, int | str], model: torch.nn.Module, compute: int | str) -> dict[str, int | str]:
    """accelerate runs every offloaded module on the first device of the map that is neither the
    CPU nor disk, and on the CPU when there is none: with a budget too small for any module on the
    GPU, `verify --device cuda` compared our GPU run with a CPU reference (2.6e-5 apart in fp32 on
    an H200). So when the map puts nothing on the compute GPU, its smallest entry goes there, and
    the GPU computes every block, with the block's weights brought in while it runs, as on our side."""
    from transformers.integrations.accelerate import compute_module_sizes

    if compute != "cpu" and compute not in placed.values():
        sizes, _ = compute_module_sizes(model)
        tied = {f"{name}." for pair in model.all_tied_weights_keys.items() for name in pair}
        untied = [name for name in placed if not any(key.startswith(f"{name}.") for key in tied)]
        placed[min(untied, key=lambda name: sizes.get(name, 0))] = compute  # a tied pair stays together
    return placed


def spread_gpus(device: str) -> int:
    """How many GPUs the reference is spread over: every visible one for a bare `cuda` (the
    CLI's `--device cuda`, and under torchrun rank 0's) when there are several; `cuda:N` pins it
    to that one GPU, and the CPU is the CPU."""
    target = torch.device(device)
    if target.type != "cuda" or target.index is not None:
        return 1
    return torch.cuda.device_count()


def gpu_free(index: int) -> int:
    """Bytes free on a GPU for the reference, counting what torch's allocator caches but does not
    use (a reference recorded just before, in another dtype, leaves its blocks cached)."""
    return torch.cuda.mem_get_info(index)[0] + torch.cuda.memory_reserved(index) - torch.cuda.memory_allocated(index)


def indivisible(model: torch.nn.Module) -> list[str]:
    """The modules accelerate never splits: the model's own no-split classes (its decoder layers)
    and the leaves (an embedding, the head)."""
    keep = set(model._no_split_modules or ())
    return [name for name, module in model.named_modules()
            if name and (type(module).__name__ in keep or next(module.children(), None) is None)]


def spread_map(reference: Loadable, dtype: torch.dtype, gpus: int, max_memory: int | None,
               reserve: int) -> dict[str, int | str]:
    """Where each module of transformers' model lives across `gpus` GPUs (`spread.py` sets each
    one's budget), and beyond them, with `max_memory`, in CPU RAM and on disk. Without
    `max_memory` a reference that does not fit the GPUs is refused, as it would not fit one."""
    from transformers.integrations.accelerate import compute_module_sizes, infer_auto_device_map

    model = meta_model(reference, dtype)
    sizes, _ = compute_module_sizes(model)
    budgets = spread_memory([gpu_free(i) for i in range(gpus)], sizes, indivisible(model), reserve, max_memory)
    placed = infer_auto_device_map(model, max_memory=budgets, no_split_module_classes=model._no_split_modules,
                                   clean_result=False)
    if max_memory is None and {"cpu", "disk"} & set(placed.values()):
        room = sum(budget for key, budget in budgets.items() if key != "cpu")
        raise InputError(f"{reference}: transformers' reference ({sizes[''] / 2**30:.1f} GiB of weights) does not fit "
                         f"the {gpus} GPUs' {room / 2**30:.1f} GiB free; pass --max-memory SIZE to offload the rest "
                         "to CPU RAM and disk")
    return computing_on(placed, model, 0)


@contextmanager
def reference_model(reference: Loadable, dtype: torch.dtype, device: str, max_memory: int | None = None,
                    reserve: int = 0) -> Iterator[torch.nn.Module]:
    """transformers' own model with eager attention (and its default experts): the ground truth for parity,
    loaded as the checkpoint's format says (a GGUF file with `gguf_file=`, dequantized by transformers).
    With `max_memory` (bytes), accelerate places what fits and offloads the rest to a temporary
    folder, loading each offloaded module onto `device` only while it runs. A bare `cuda` with
    several GPUs visible spreads it over all of them (`spread_map`), each keeping `reserve` bytes
    free for the activations."""
    with tempfile.TemporaryDirectory(prefix="lmconvert-offload-") as offload:
        yield load_reference(reference, dtype, device, max_memory, offload, reserve)


def placement(reference: Loadable, dtype: torch.dtype, device: str, max_memory: int | None,
              reserve: int) -> dict[str, int | str] | None:
    """accelerate's `device_map` for the reference, or None for the whole model on `device`; a family
    whose transformers model accelerate cannot offload (`Family.no_offload`) is refused by name."""
    if max_memory is not None:
        from transformers import AutoConfig

        model_type = AutoConfig.from_pretrained(str(reference.where), **reference.kwargs).model_type
        family = BY_MODEL_TYPE.get(model_type)
        if family is not None and family.no_offload:
            raise InputError(f"--max-memory: {model_type}: {family.no_offload}; verify it without --max-memory, on a "
                             "machine that holds transformers' model")
    gpus = spread_gpus(device)
    if gpus > 1:
        return spread_map(reference, dtype, gpus, max_memory, reserve)
    return None if max_memory is None else offload_map(reference, dtype, device, max_memory)


def dequantizing(config: object) -> dict[str, object]:
    """A quantized checkpoint transformers reads on CPU loads dequantized (MXFP4: `Mxfp4Config(dequantize=True)`);
    a block-wise or per-tensor FP8 one (`FineGrainedFP8Config(dequantize=True)`: each
    weight times its block's scale, in float32, cast to `dtype`), as lmconvert reads it: on CPU
    transformers does so by itself, on a GPU it would run FP8 kernels instead."""
    quant = getattr(config, "quantization_config", None)
    method = quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", None)
    if method == "fp8":
        from transformers import FineGrainedFP8Config

        return {"quantization_config": FineGrainedFP8Config(dequantize=True)}
    if method == "mxfp4":  # gpt-oss's experts: `convert_moe_packed_tensors`, as lmconvert reads them
        from transformers import Mxfp4Config

        return {"quantization_config": Mxfp4Config(dequantize=True)}
    if method == "compressed-tensors":  # decompressed on load, weights alone (a declared activation scheme
        # not run): the model lmconvert's dequantized weights make (formats/compressed_tensors.py)
        from transformers import CompressedTensorsConfig

        return {"quantization_config": CompressedTensorsConfig(run_compressed=False)}
    return {}


def load_reference(reference: Loadable, dtype: torch.dtype, device: str, max_memory: int | None = None,
                   offload: str | None = None, reserve: int = 0) -> torch.nn.Module:
    from transformers import AutoConfig
    from transformers.utils import logging

    logging.disable_progress_bar()
    if reference.refusal is not None:
        raise InputError(reference.refusal)
    try:
        placed = placement(reference, dtype, device, max_memory, reserve)
        extra = {} if placed is None else {"device_map": placed, "offload_folder": offload}
        # transformers' default experts (grouped_mm): ours sum a mixture of experts in its order by default
        config = AutoConfig.from_pretrained(str(reference.where), **reference.kwargs)
        model = auto_class(config).from_pretrained(str(reference.where), dtype=dtype, attn_implementation="eager",
                                                   **reference.kwargs, **extra, **dequantizing(config))
    except ImportError as exc:  # device_map needs accelerate
        what = "--max-memory" if max_memory is not None else f"--device {device} over {spread_gpus(device)} GPUs"
        raise InputError(f"{what}: transformers cannot place the reference ({exc}); pip install accelerate") from None
    except InputError:  # ours, already one line (a spread that does not fit)
        raise
    except (OSError, ValueError, KeyError, NotImplementedError) as exc:  # files transformers cannot read: an
        # index without its `metadata` (KeyError), a GGUF architecture its loader lacks (NotImplementedError)
        raise InputError(f"{reference}: transformers cannot load this reference ({type(exc).__name__}: {exc}); "
                         "pass --reference with one it loads") from None
    if placed is None:
        model = aligned(model.to(device))
    return model.eval()


def aligned(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with each CPU parameter that transformers left at the file's alignment copied to fresh memory, as
    it copies every tensor it converts (and as ours are). A tensor taken straight from a safetensors mapping sits
    wherever the file's header put it (8-byte aligned); on AVX-512 CPUs the math library's fp32 product of a single
    row then rounds its last bit otherwise (Gemma 4's and LaraMini's fused experts in cached decoding: 1e-5 apart),
    so without the copy the reference's own results would depend on the file's header length."""
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.device.type == "cpu" and parameter.data_ptr() % 64:
                parameter.data = parameter.data.clone()
    return model


@torch.no_grad()
def reference_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(ids).logits


EMBEDDING_MODULE = "<input embeddings>"  # the embedding module's output, kept aside from the points
FINAL_MODULE = "<final norm>"  # the final norm module's output, kept aside from the points


@torch.no_grad()
def reference_trace(model: torch.nn.Module, ids: torch.Tensor, arch: ArchConfig, table: TensorTable,
                    attention_mask: torch.Tensor | None = None) -> Trace:
    """Logits and points from transformers. `output_hidden_states` gives the embedding output
    (entry 0) and the blocks' outputs; in transformers 5 its last entry is the final norm's
    output (`last_hidden_state`), so the last block's own output comes from a forward hook on
    that decoder layer, like every weight-owning module inside the blocks. (Every decoder layer
    is hooked: should a model return hidden states in another layout, the hooks stand in.)
    Every point is then put in our layout, as `layouts.py` declares for this model type; those
    that do not fit their declaration are left out and named in `problems`."""
    paths = hf_point_modules(model, arch, table, unobserved(arch))
    modules = dict(model.named_modules())
    layouts = PointLayouts.of(arch, model_type(model), *ids.shape)
    recorder = Recorder()
    for point, path in paths.items():
        declared = layouts.theirs.get(EXPERT.sub("mlp.expert", sublayer_of(point)))
        if arch.moe is not None and sublayer_of(point) == "mlp.experts":
            if isinstance(declared, Summed):  # every expert's input stacked: each alone on the mixture's input
                experts = modules[path]
                recorder.experts_alone(point, modules[path.rpartition(".")[0]],
                                       lambda _m, args, e, experts=experts: stacked_expert_alone(experts, args, e),
                                       arch.moe.n_experts)
            elif isinstance(declared, Parallel):  # run inline by the mixture's module: each alone through its products
                recorder.experts_alone(point, modules[path], parallel_expert_alone, arch.moe.n_experts)
            else:
                recorder.experts_alone(point, modules[path], expert_alone, arch.moe.n_experts)
        recorder.output_of(point, modules[path], declared.index if isinstance(declared, Returned) else 0)
    if hasattr(model, "get_input_embeddings"):
        recorder.output_of(EMBEDDING_MODULE, model.get_input_embeddings())
    final = hf_final_norm(model, table)
    if final is not None:
        recorder.output_of(FINAL_MODULE, modules[final])
    try:
        out = model(ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False)
    finally:
        recorder.close()
    points = recorder.result()
    embedded = points.pop(EMBEDDING_MODULE, None)
    normed = points.pop(FINAL_MODULE, None)
    states = out.hidden_states
    if states is not None and len(states) == arch.n_layers + 1:
        first = states[0].detach().to("cpu", copy=True)
        if "layers.0" in points and torch.equal(first, points["layers.0"]):
            # Mamba's and FalconMamba's: each block's output, then the final norm's; no embedding entry, so
            # the embedding module's own output stands in (nothing is added to it before the first block)
            if embedded is not None:
                points[EMBED] = embedded
        else:
            points[EMBED] = first
            for i in range(arch.n_layers - 1):
                points[f"layers.{i}"] = states[i + 1].detach().to("cpu", copy=True)
        last = states[-1].detach().to("cpu", copy=True)
        # Gemma 3n's text model does not put the final norm's output last (tie_last_hidden_states=False): the last
        # entry is the last block's output (AltUp's streams), and the final norm's module gives the point
        untied = normed is not None and f"layers.{arch.n_layers - 1}" in points \
            and torch.equal(last, points[f"layers.{arch.n_layers - 1}"])
        points[FINAL] = normed if untied else last
    return Trace(out.logits, *layouts.all_to_ours(points))


def expert_alone(experts: torch.nn.Module, args: tuple, e: int) -> torch.Tensor:
    """transformers' experts module (`MixtralExperts`, `Qwen2MoeExperts`, ...: hidden states,
    top-k indices, top-k weights) with every token routed to expert `e` alone at weight 1: that
    expert's own output, by transformers' own code. `forward` is called, not the module, so that
    the hooks on it do not run again."""
    h = args[0]
    tokens = h.numel() // h.shape[-1]  # DBRX's experts take the unflattened hidden states
    return experts.forward(h, torch.full((tokens, 1), e, dtype=torch.long, device=h.device),
                           torch.ones((tokens, 1), dtype=h.dtype, device=h.device))


def stacked_expert_alone(experts: torch.nn.Module, args: tuple, e: int) -> torch.Tensor:
    """Llama 4's experts module (`Llama4TextExperts`: every expert's input stacked, [experts * tokens, d],
    each already weighted) given the mixture's input (`args`, its module's) in expert `e`'s block and zeros
    in the others: expert `e`'s own output at weight 1, by transformers' own code."""
    h = args[0].reshape(-1, args[0].shape[-1])
    n = experts.gate_up_proj.shape[0]
    stacked = h.new_zeros((n, *h.shape))
    stacked[e] = h
    return experts.forward(stacked.reshape(-1, h.shape[-1])).view(n, *h.shape)[e]


def parallel_expert_alone(mixture: torch.nn.Module, args: tuple, e: int) -> torch.Tensor:
    """JetMoE's mixture (`JetMoeMoE`: experts run inline on rows sorted by expert, `input_linear` then the
    activation of the first half times the second, then `output_linear`) given every token as expert `e`'s
    rows: expert `e`'s own output at weight 1, through transformers' own expert modules."""
    h = args[0].reshape(-1, args[0].shape[-1])
    sizes = [0] * mixture.input_linear.num_experts
    sizes[e] = h.shape[0]
    gate, up = mixture.input_linear.forward(h, sizes).chunk(2, dim=-1)
    return mixture.output_linear.forward(mixture.activation(gate) * up, sizes)


def model_type(model: torch.nn.Module) -> str:
    """The model type that names transformers' decoder modules: the text model's, for a
    multimodal wrapper (Gemma3ForConditionalGeneration runs Gemma 3's text decoder)."""
    config = model.config
    return (config.get_text_config() if hasattr(config, "get_text_config") else config).model_type


@torch.no_grad()
def reference_greedy(model: torch.nn.Module, prompt: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' own `generate`, greedy, for exactly n tokens: (prompt + tokens, raw logits of
    each step (B, n, vocab)). Whatever the checkpoint's generation_config.json asks for (EOS stop,
    repetition penalty, forced or suppressed tokens) is switched off: this is pure argmax. The
    attention mask is explicit, or a prompt token that equals the pad id would be masked out."""
    pad = getattr(model.config, "pad_token_id", None)
    neutral = dict(min_new_tokens=None, do_sample=False, num_beams=1, eos_token_id=None, repetition_penalty=None,
                   no_repeat_ngram_size=None, bad_words_ids=None, suppress_tokens=None, begin_suppress_tokens=None,
                   forced_bos_token_id=None, forced_eos_token_id=None)
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n,
                         pad_token_id=0 if pad is None else pad, output_logits=True, return_dict_in_generate=True,
                         **neutral)
    return out.sequences, torch.stack(out.logits, 1)
