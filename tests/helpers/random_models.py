"""Tiny random-weight GGUFs of the recurrent architectures no small real model exists for.

* ``qwen35`` — hybrid: gated-delta-net recurrent layers and attention layers, the production
  model's (Qwen3.5-4B) architecture; its memory cannot drop part of a sequence.
* ``mamba`` — purely recurrent: no attention and no KV cells at all, only a per-sequence state.
* ``gemma3`` — dense attention with sliding-window layers (the demo gemma's architecture), for machines
  where no model package can travel (the GPU check).

None can be downloaded in tests, so each is built at test time: seeded random weights (like
llama.cpp's ``tests/test-llama-archs.cpp``, whose hyper-parameters they follow), the tokenizer and chat
template copied from the Qwen2.5 test model, written with the ``gguf`` package. About 10 MB each
(the copied vocabulary); cached by the caller, never committed.

``build_shaped`` writes a qwen35 model with a production model's exact shapes (``QWEN35_4B``: Qwen3.5-4B)
in f16, for timings: compute does not depend on the weights' values, so after quantizing it runs like the
real model. ``python tests/helpers/random_models.py shaped 4b TOKENIZER.gguf OUT.gguf``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SEED = 1234
STDEV = 0.1
VERSION = "1"  # bump when a layout below changes, so cached files are rebuilt

# qwen35 (hybrid)
N_EMBD = 64
N_HEAD = 2
N_HEAD_KV = 1
N_FF = 128
N_LAYER = 4  # full attention every 2nd layer: recurrent, attention, recurrent, attention
SSM_STATE = 32  # head size of the gated delta net (k and v)
SSM_GROUPS = 2  # k heads
SSM_V_HEADS = 2  # v heads (time_step_rank)
SSM_CONV = 4

# mamba (pure recurrent, Mamba-1)
MAMBA_EMBD = 64
MAMBA_LAYER = 2
MAMBA_INNER = 2 * MAMBA_EMBD
MAMBA_STATE = 16
MAMBA_DT_RANK = 4
MAMBA_CONV = 4

# gemma3 (dense; every layer but each 6th attends through a sliding window)
DENSE_EMBD = 64
DENSE_HEAD = 2
DENSE_HEAD_KV = 1
DENSE_FF = 128
DENSE_LAYER = 6  # five sliding-window layers, then one global
DENSE_SWA = 512  # the demo gemma's window; agent-loop states outgrow it (per-block canonical layout)


def fixture_name(arch: str = "qwen35") -> str:
    if arch == "qwen35":
        spec = f"{VERSION}:{arch}:{SEED}:{N_EMBD}:{N_HEAD}:{N_HEAD_KV}:{N_FF}:{N_LAYER}:{SSM_STATE}"
    elif arch == "gemma3":
        dims = (DENSE_EMBD, DENSE_HEAD, DENSE_HEAD_KV, DENSE_FF, DENSE_LAYER, DENSE_SWA)
        spec = f"{VERSION}:{arch}:{SEED}:" + ":".join(map(str, dims))
    else:
        spec = (
            f"{VERSION}:{arch}:{SEED}:{MAMBA_EMBD}:{MAMBA_LAYER}:{MAMBA_INNER}:{MAMBA_STATE}:{MAMBA_DT_RANK}"
        )
    return f"tiny-{arch}-{hashlib.sha256(spec.encode()).hexdigest()[:12]}.gguf"


def _qwen35_shapes(n_vocab: int) -> dict[str, tuple[int, ...]]:
    """Tensor name -> ggml shape (ne0 first), as llama.cpp's qwen35 loader expects them."""
    head = N_EMBD // N_HEAD
    key_dim = SSM_STATE * SSM_GROUPS
    value_dim = SSM_STATE * SSM_V_HEADS
    conv_dim = 2 * key_dim + value_dim
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (N_EMBD, n_vocab),
        "output_norm.weight": (N_EMBD,),
    }
    for il in range(N_LAYER):
        blk = f"blk.{il}"
        shapes[f"{blk}.attn_norm.weight"] = (N_EMBD,)
        shapes[f"{blk}.post_attention_norm.weight"] = (N_EMBD,)
        if (il + 1) % 2 == 0:  # full attention; the query carries its output gate (x2)
            shapes[f"{blk}.attn_q.weight"] = (N_EMBD, head * N_HEAD * 2)
            shapes[f"{blk}.attn_k.weight"] = (N_EMBD, head * N_HEAD_KV)
            shapes[f"{blk}.attn_v.weight"] = (N_EMBD, head * N_HEAD_KV)
            shapes[f"{blk}.attn_output.weight"] = (head * N_HEAD, N_EMBD)
            shapes[f"{blk}.attn_q_norm.weight"] = (head,)
            shapes[f"{blk}.attn_k_norm.weight"] = (head,)
        else:  # gated delta net
            shapes[f"{blk}.attn_qkv.weight"] = (N_EMBD, conv_dim)
            shapes[f"{blk}.attn_gate.weight"] = (N_EMBD, value_dim)
            shapes[f"{blk}.ssm_conv1d.weight"] = (SSM_CONV, conv_dim)
            shapes[f"{blk}.ssm_dt.bias"] = (SSM_V_HEADS,)
            shapes[f"{blk}.ssm_a"] = (SSM_V_HEADS,)
            shapes[f"{blk}.ssm_beta.weight"] = (N_EMBD, SSM_V_HEADS)
            shapes[f"{blk}.ssm_alpha.weight"] = (N_EMBD, SSM_V_HEADS)
            shapes[f"{blk}.ssm_norm.weight"] = (SSM_STATE,)
            shapes[f"{blk}.ssm_out.weight"] = (value_dim, N_EMBD)
        shapes[f"{blk}.ffn_gate.weight"] = (N_EMBD, N_FF)
        shapes[f"{blk}.ffn_up.weight"] = (N_EMBD, N_FF)
        shapes[f"{blk}.ffn_down.weight"] = (N_FF, N_EMBD)
    return shapes


def _mamba_shapes(n_vocab: int) -> dict[str, tuple[int, ...]]:
    """Tensor name -> ggml shape (ne0 first), as llama.cpp's mamba loader expects them."""
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (MAMBA_EMBD, n_vocab),
        "output_norm.weight": (MAMBA_EMBD,),
    }
    for il in range(MAMBA_LAYER):
        blk = f"blk.{il}"
        shapes[f"{blk}.attn_norm.weight"] = (MAMBA_EMBD,)
        shapes[f"{blk}.ssm_in.weight"] = (MAMBA_EMBD, 2 * MAMBA_INNER)
        shapes[f"{blk}.ssm_conv1d.weight"] = (MAMBA_CONV, MAMBA_INNER)
        shapes[f"{blk}.ssm_conv1d.bias"] = (MAMBA_INNER,)
        shapes[f"{blk}.ssm_x.weight"] = (MAMBA_INNER, MAMBA_DT_RANK + 2 * MAMBA_STATE)
        shapes[f"{blk}.ssm_dt.weight"] = (MAMBA_DT_RANK, MAMBA_INNER)
        shapes[f"{blk}.ssm_dt.bias"] = (MAMBA_INNER,)
        shapes[f"{blk}.ssm_a"] = (MAMBA_STATE, MAMBA_INNER)
        shapes[f"{blk}.ssm_d"] = (MAMBA_INNER,)
        shapes[f"{blk}.ssm_out.weight"] = (MAMBA_INNER, MAMBA_EMBD)
    return shapes


def _qwen35_hparams(w: Any) -> None:
    head = N_EMBD // N_HEAD
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_key_length(head)
    w.add_value_length(head)
    w.add_rope_freq_base(1e7)
    w.add_uint32("qwen35.full_attention_interval", 2)
    w.add_array("qwen35.rope.dimension_sections", [head // 4] * 4)
    w.add_uint32("qwen35.ssm.conv_kernel", SSM_CONV)
    w.add_uint32("qwen35.ssm.inner_size", SSM_STATE * SSM_V_HEADS)
    w.add_uint32("qwen35.ssm.state_size", SSM_STATE)
    w.add_uint32("qwen35.ssm.time_step_rank", SSM_V_HEADS)
    w.add_uint32("qwen35.ssm.group_count", SSM_GROUPS)


def _mamba_hparams(w: Any) -> None:
    w.add_embedding_length(MAMBA_EMBD)
    w.add_block_count(MAMBA_LAYER)
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_uint32("mamba.ssm.conv_kernel", MAMBA_CONV)
    w.add_uint32("mamba.ssm.inner_size", MAMBA_INNER)
    w.add_uint32("mamba.ssm.state_size", MAMBA_STATE)
    w.add_uint32("mamba.ssm.time_step_rank", MAMBA_DT_RANK)


def _gemma3_shapes(n_vocab: int) -> dict[str, tuple[int, ...]]:
    """Tensor name -> ggml shape (ne0 first), as llama.cpp's gemma3 loader expects them (tied output)."""
    head = DENSE_EMBD // DENSE_HEAD
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (DENSE_EMBD, n_vocab),
        "output_norm.weight": (DENSE_EMBD,),
    }
    for il in range(DENSE_LAYER):
        blk = f"blk.{il}"
        shapes[f"{blk}.attn_norm.weight"] = (DENSE_EMBD,)
        shapes[f"{blk}.attn_q.weight"] = (DENSE_EMBD, head * DENSE_HEAD)
        shapes[f"{blk}.attn_k.weight"] = (DENSE_EMBD, head * DENSE_HEAD_KV)
        shapes[f"{blk}.attn_v.weight"] = (DENSE_EMBD, head * DENSE_HEAD_KV)
        shapes[f"{blk}.attn_output.weight"] = (head * DENSE_HEAD, DENSE_EMBD)
        shapes[f"{blk}.post_attention_norm.weight"] = (DENSE_EMBD,)
        shapes[f"{blk}.attn_q_norm.weight"] = (head,)
        shapes[f"{blk}.attn_k_norm.weight"] = (head,)
        shapes[f"{blk}.ffn_norm.weight"] = (DENSE_EMBD,)
        shapes[f"{blk}.ffn_gate.weight"] = (DENSE_EMBD, DENSE_FF)
        shapes[f"{blk}.ffn_up.weight"] = (DENSE_EMBD, DENSE_FF)
        shapes[f"{blk}.ffn_down.weight"] = (DENSE_FF, DENSE_EMBD)
        shapes[f"{blk}.post_ffw_norm.weight"] = (DENSE_EMBD,)
    return shapes


def _gemma3_hparams(w: Any) -> None:
    head = DENSE_EMBD // DENSE_HEAD
    w.add_embedding_length(DENSE_EMBD)
    w.add_block_count(DENSE_LAYER)
    w.add_feed_forward_length(DENSE_FF)
    w.add_head_count(DENSE_HEAD)
    w.add_head_count_kv(DENSE_HEAD_KV)
    w.add_key_length(head)
    w.add_value_length(head)
    w.add_rope_freq_base(1e6)
    w.add_sliding_window(DENSE_SWA)


ARCHS: dict[str, tuple[Callable[[int], dict[str, tuple[int, ...]]], Callable[[Any], None]]] = {
    "qwen35": (_qwen35_shapes, _qwen35_hparams),
    "mamba": (_mamba_shapes, _mamba_hparams),
    "gemma3": (_gemma3_shapes, _gemma3_hparams),
}


def _copy_tokenizer(reader: Any, writer: Any) -> int:
    """Copy tokenizer.* keys (vocabulary, merges, specials, chat template); returns the vocab size."""
    import gguf

    n_vocab = 0
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        value_type = field.types[0]
        value = field.contents()
        if value_type == gguf.GGUFValueType.ARRAY:
            writer.add_array(name, value)
            if name == "tokenizer.ggml.tokens":
                n_vocab = len(value)
        else:
            writer.add_key_value(name, value, value_type)
    if n_vocab == 0:
        raise ValueError("the source GGUF has no tokenizer.ggml.tokens")
    return n_vocab


def build(arch: str, tokenizer_gguf: Path, out: Path) -> Path:
    """Write the fixture to ``out`` (atomically: a partial file is never left under that name)."""
    import gguf

    shapes_of, add_hparams = ARCHS[arch]
    reader = gguf.GGUFReader(tokenizer_gguf)
    tmp = out.with_suffix(".tmp")
    writer = gguf.GGUFWriter(tmp, arch)
    writer.add_name(f"tiny random {arch} (test fixture)")
    n_vocab = _copy_tokenizer(reader, writer)
    writer.add_context_length(4096)
    writer.add_layer_norm_rms_eps(1e-6)
    add_hparams(writer)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)

    rng = np.random.default_rng(SEED)
    for name, shape in shapes_of(n_vocab).items():
        data = rng.normal(0.0, STDEV, size=shape[::-1]).astype(np.float32)
        if name.endswith("ssm_a"):
            data = -np.abs(data)  # state decay must be negative
        if name == "token_embd.weight":  # the bulk of the file: 8-bit keeps it small
            writer.add_tensor(
                name,
                gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0),
                raw_dtype=gguf.GGMLQuantizationType.Q8_0,
            )
        else:
            writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out)
    return out


def ensure_random_model(arch: str, cache_dir: Path, tokenizer_gguf: Path) -> Path:
    out = cache_dir / fixture_name(arch)
    if not out.is_file():
        cache_dir.mkdir(parents=True, exist_ok=True)
        build(arch, tokenizer_gguf, out)
    return out


# --- production-shaped models (timings) ------------------------------------------------------------


@dataclass(frozen=True)
class Qwen35Shape:
    """The hyper-parameters that fix a qwen35 model's compute (ggml names in the comments)."""

    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int  # attention.key_length = value_length
    n_ff: int
    full_attention_interval: int  # every n-th layer is full attention, the rest gated delta nets
    ssm_state: int  # ssm.state_size: head size of the delta net's k and v
    ssm_groups: int  # ssm.group_count: k heads
    ssm_v_heads: int  # ssm.time_step_rank: v heads
    ssm_conv: int
    rope_dims: int  # rope.dimension_count (partial rotary)
    rope_sections: tuple[int, int, int, int]  # interleaved multi-section rope; sums to rope_dims / 2
    n_vocab: int | None  # padded to exactly this many tokens; None keeps the tokenizer's own count
    context_length: int


# Qwen3.5-4B (Qwen/Qwen3.5-4B config.json, text tower): 32 layers, full attention every 4th (3, 7, ..., 31),
# GQA 16/4 heads of 256 with a quarter rotated, delta nets of 16 k and 32 v heads of 128, tied embeddings.
QWEN35_4B = Qwen35Shape(
    n_embd=2560, n_layer=32, n_head=16, n_head_kv=4, head_dim=256, n_ff=9216, full_attention_interval=4,
    ssm_state=128, ssm_groups=16, ssm_v_heads=32, ssm_conv=4, rope_dims=64, rope_sections=(11, 11, 10, 0),
    n_vocab=248_320, context_length=262_144,
)  # fmt: skip
# The same layout scaled down for the CPU dry run of the GPU check (one full-attention layer in four).
QWEN35_SMALL = Qwen35Shape(
    n_embd=256, n_layer=4, n_head=4, n_head_kv=1, head_dim=64, n_ff=512, full_attention_interval=4,
    ssm_state=32, ssm_groups=8, ssm_v_heads=16, ssm_conv=4, rope_dims=16, rope_sections=(3, 3, 2, 0),
    n_vocab=None, context_length=32_768,
)  # fmt: skip
# A 0.8B-class model in the same layout, for CPU timings on a small machine (the peer benchmark's hybrid
# row): the 4B's head sizes, delta-net heads and vocabulary, narrower and shallower (24 layers, one in four
# full attention). Chosen, not copied from a released config: its compute is what matters here.
QWEN35_08B = Qwen35Shape(
    n_embd=1024, n_layer=24, n_head=8, n_head_kv=2, head_dim=256, n_ff=3584, full_attention_interval=4,
    ssm_state=128, ssm_groups=16, ssm_v_heads=16, ssm_conv=4, rope_dims=64, rope_sections=(11, 11, 10, 0),
    n_vocab=248_320, context_length=262_144,
)  # fmt: skip
SHAPES = {"4b": QWEN35_4B, "0.8b": QWEN35_08B, "small": QWEN35_SMALL}
POOL_VALUES = 1 << 24  # the random pool every matrix is cut from (32 MiB of f16)


def shaped_tensors(spec: Qwen35Shape, n_vocab: int) -> dict[str, tuple[int, ...]]:
    """Tensor name -> ggml shape (ne0 first) for ``spec``, as llama.cpp's qwen35 loader expects them."""
    key_dim = spec.ssm_state * spec.ssm_groups
    value_dim = spec.ssm_state * spec.ssm_v_heads
    conv_dim = 2 * key_dim + value_dim
    attn = spec.head_dim * spec.n_head
    kv = spec.head_dim * spec.n_head_kv
    e = spec.n_embd
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (e, n_vocab), "output_norm.weight": (e,)}
    for il in range(spec.n_layer):
        blk = f"blk.{il}"
        shapes[f"{blk}.attn_norm.weight"] = (e,)
        shapes[f"{blk}.post_attention_norm.weight"] = (e,)
        if (il + 1) % spec.full_attention_interval == 0:
            shapes[f"{blk}.attn_q.weight"] = (e, attn * 2)  # the query carries its output gate
            shapes[f"{blk}.attn_k.weight"] = (e, kv)
            shapes[f"{blk}.attn_v.weight"] = (e, kv)
            shapes[f"{blk}.attn_output.weight"] = (attn, e)
            shapes[f"{blk}.attn_q_norm.weight"] = (spec.head_dim,)
            shapes[f"{blk}.attn_k_norm.weight"] = (spec.head_dim,)
        else:
            shapes[f"{blk}.attn_qkv.weight"] = (e, conv_dim)
            shapes[f"{blk}.attn_gate.weight"] = (e, value_dim)
            shapes[f"{blk}.ssm_conv1d.weight"] = (spec.ssm_conv, conv_dim)
            shapes[f"{blk}.ssm_dt.bias"] = (spec.ssm_v_heads,)
            shapes[f"{blk}.ssm_a"] = (spec.ssm_v_heads,)
            shapes[f"{blk}.ssm_beta.weight"] = (e, spec.ssm_v_heads)
            shapes[f"{blk}.ssm_alpha.weight"] = (e, spec.ssm_v_heads)
            shapes[f"{blk}.ssm_norm.weight"] = (spec.ssm_state,)
            shapes[f"{blk}.ssm_out.weight"] = (value_dim, e)
        shapes[f"{blk}.ffn_gate.weight"] = (e, spec.n_ff)
        shapes[f"{blk}.ffn_up.weight"] = (e, spec.n_ff)
        shapes[f"{blk}.ffn_down.weight"] = (spec.n_ff, e)
    return shapes


def _shaped_hparams(w: Any, spec: Qwen35Shape) -> None:
    w.add_context_length(spec.context_length)
    w.add_embedding_length(spec.n_embd)
    w.add_block_count(spec.n_layer)
    w.add_feed_forward_length(spec.n_ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_key_length(spec.head_dim)
    w.add_value_length(spec.head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e7)
    w.add_rope_dimension_count(spec.rope_dims)
    w.add_array("qwen35.rope.dimension_sections", list(spec.rope_sections))
    w.add_uint32("qwen35.full_attention_interval", spec.full_attention_interval)
    w.add_uint32("qwen35.ssm.conv_kernel", spec.ssm_conv)
    w.add_uint32("qwen35.ssm.inner_size", spec.ssm_state * spec.ssm_v_heads)
    w.add_uint32("qwen35.ssm.state_size", spec.ssm_state)
    w.add_uint32("qwen35.ssm.time_step_rank", spec.ssm_v_heads)
    w.add_uint32("qwen35.ssm.group_count", spec.ssm_groups)


def _copy_tokenizer_padded(reader: Any, writer: Any, n_vocab: int | None) -> int:
    """Copy the tokenizer, padding the vocabulary with unused ``[PADn]`` tokens to ``n_vocab``."""
    import gguf

    tokens: list[str] = []
    types: list[int] = []
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        value = field.contents()
        if name == "tokenizer.ggml.tokens":
            tokens = list(value)
        elif name == "tokenizer.ggml.token_type":
            types = list(value)
        elif field.types[0] == gguf.GGUFValueType.ARRAY:
            writer.add_array(name, value)
        else:
            writer.add_key_value(name, value, field.types[0])
    if not tokens or len(types) != len(tokens):
        raise ValueError("the source GGUF has no complete tokenizer.ggml.tokens/token_type")
    target = n_vocab or len(tokens)
    if target < len(tokens):
        raise ValueError(f"n_vocab {target} is below the tokenizer's {len(tokens)} tokens")
    pad = range(target - len(tokens))
    writer.add_array("tokenizer.ggml.tokens", tokens + [f"[PAD{i}]" for i in pad])
    writer.add_array("tokenizer.ggml.token_type", types + [int(gguf.TokenType.UNUSED)] * len(pad))
    return target


def _shaped_values(name: str, shape: tuple[int, ...], pool: np.ndarray, offset: int) -> np.ndarray:
    """f16 data for one tensor: matrices cut (cyclically) from the seeded pool, scaled by 1/sqrt(fan-in)
    so activations stay finite through every layer; norms 1, decay negative, biases small."""
    n = int(np.prod(shape))
    if name.endswith("norm.weight"):
        return np.ones(shape[::-1], dtype=np.float32)
    if name.endswith("ssm_a"):
        return -np.abs(np.resize(pool[offset:], n)).astype(np.float32).reshape(shape[::-1]) - 0.5
    if name.endswith(".bias") or name.endswith("ssm_conv1d.weight") or len(shape) == 1:
        return (np.resize(pool[offset:], n).astype(np.float32) * 0.1).reshape(shape[::-1])
    scale = np.float16(1.0 / np.sqrt(shape[0]))
    start = offset % pool.size
    data = np.concatenate([pool[start:], pool[:start]]) if n > pool.size - start else pool[start : start + n]
    return (np.resize(data, n) * scale).reshape(shape[::-1])


def build_shaped(spec: Qwen35Shape, tokenizer_gguf: Path, out: Path) -> dict[str, Any]:
    """Write a random-weight qwen35 model with ``spec``'s exact shapes in f16 (norms, biases and small
    state tensors f32, as the converter writes them), streaming one tensor at a time. Returns a summary."""
    import gguf

    started = time.perf_counter()
    reader = gguf.GGUFReader(tokenizer_gguf)
    tmp = out.with_suffix(".tmp")
    writer = gguf.GGUFWriter(tmp, "qwen35")
    writer.add_name("random qwen35 with production shapes (timings only)")
    n_vocab = _copy_tokenizer_padded(reader, writer, spec.n_vocab)
    _shaped_hparams(writer, spec)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    shapes = shaped_tensors(spec, n_vocab)
    pool = np.random.default_rng(SEED).standard_normal(POOL_VALUES, dtype=np.float32).astype(np.float16)
    params = 0
    for name, shape in shapes.items():
        n = int(np.prod(shape))
        params += n
        dtype = np.float16 if len(shape) == 2 and not name.endswith("ssm_conv1d.weight") else np.float32
        writer.add_tensor_info(name, shape[::-1], np.dtype(dtype), n * np.dtype(dtype).itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for i, (name, shape) in enumerate(shapes.items()):
        values = _shaped_values(name, shape, pool, offset=i * 7919)
        dtype = np.float16 if len(shape) == 2 and not name.endswith("ssm_conv1d.weight") else np.float32
        writer.write_tensor_data(np.ascontiguousarray(values, dtype=dtype))
    writer.close()
    tmp.replace(out)
    return {
        "parameters": params,
        "n_vocab": n_vocab,
        "tensors": len(shapes),
        "bytes": out.stat().st_size,
        "seconds": time.perf_counter() - started,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write a random-weight GGUF (a fixture or a shaped model).")
    sub = parser.add_subparsers(dest="command", required=True)
    fixture = sub.add_parser("fixture", help="a tiny fixture: qwen35, mamba or gemma3")
    fixture.add_argument("arch", choices=sorted(ARCHS))
    fixture.add_argument("tokenizer", type=Path)
    fixture.add_argument("out", type=Path)
    shaped = sub.add_parser("shaped", help="production shapes in f16 (quantize it with llama-quantize)")
    shaped.add_argument("shape", choices=sorted(SHAPES))
    shaped.add_argument("tokenizer", type=Path)
    shaped.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.command == "fixture":
        print(build(args.arch, args.tokenizer, args.out))
        return 0
    summary = build_shaped(SHAPES[args.shape], args.tokenizer, args.out)
    print(json.dumps({"shape": args.shape, "path": str(args.out), **summary}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
