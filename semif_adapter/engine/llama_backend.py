"""A thin, typed layer over llama.cpp's C API (through llama-cpp-python's ctypes bindings).

We drive ``llama_decode`` ourselves instead of using ``llama_cpp.Llama`` because decisions need
things the high-level class does not offer: two sequences in one context (the shared prefix and a
branch), whole-sequence copy/removal, and the last position's logits without ``logits_all``.

The library is whatever ``llama_cpp`` loads: its bundled build, or the DLC's own ``libllama`` when
``LLAMA_CPP_LIB_PATH`` points there. Binding and library can drift apart, so the symbols we call are
checked once, up front, with one clear message.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from semif_adapter.engine import abi, binding, kernels
from semif_adapter.errors import EngineFailure, ModelLoadError

if TYPE_CHECKING:
    from semif_adapter.engine.deadline import Deadline

log = logging.getLogger(__name__)

REQUIRED_SYMBOLS: tuple[str, ...] = (
    "llama_backend_init",
    "llama_model_default_params",
    "llama_context_default_params",
    "llama_model_load_from_file",
    "llama_model_free",
    "llama_init_from_model",
    "llama_free",
    "llama_model_get_vocab",
    "llama_vocab_n_tokens",
    "llama_vocab_get_add_bos",
    "llama_vocab_bos",
    "llama_vocab_eos",
    "llama_vocab_is_control",
    "llama_tokenize",
    "llama_token_to_piece",
    "llama_model_chat_template",
    "llama_model_meta_val_str",
    "llama_model_n_ctx_train",
    "llama_model_is_recurrent",
    "llama_model_is_hybrid",
    "llama_model_n_swa",
    "llama_supports_gpu_offload",
    "llama_get_memory",
    "llama_memory_clear",
    "llama_memory_seq_rm",
    "llama_memory_seq_cp",
    "llama_state_seq_get_size",
    "llama_state_seq_get_data",
    "llama_state_seq_set_data",
    "llama_batch_init",
    "llama_batch_free",
    "llama_decode",
    "llama_set_abort_callback",
    "llama_get_logits_ith",
    "llama_n_seq_max",
    "llama_log_set",
)

PREFIX_SEQ = 0
BRANCH_SEQ = 1

#: Rows of one sequence that put a call on flash attention's tiled CPU path (ggml-cpu's
#: ``GGML_FA_TILE_Q``). Fewer take a per-row path whose numbers differ, so in invariant numerics with
#: flash attention every sequence's piece of a call is padded to at least this many rows
#: (``LlamaRuntime.min_rows``).
FLASH_TILE_ROWS = 64


@dataclass(frozen=True)
class Part:
    """One sequence's tokens in a shared ``llama_decode`` call, from position ``start_pos``; the last
    ``filler`` of them only pad the call to one shape (``calls.padded_lengths``): the logits are read at
    the token before them, and the caller drops their cells after the call."""

    tokens: Sequence[int]
    start_pos: int
    seq: int
    want_logits: bool = True
    filler: int = 0

    def padded(self, width: int) -> Part:
        """This part with filler up to ``width`` tokens (its last token again: any token would do)."""
        extra = width - len(self.tokens)
        if extra <= 0:
            return self
        return replace(self, tokens=[*self.tokens, *[self.tokens[-1]] * extra], filler=self.filler + extra)

    @property
    def end(self) -> int:
        """The position after the part's last real token (where its filler starts)."""
        return self.start_pos + len(self.tokens) - self.filler


DECODE_ABORTED = 2  # llama_decode's return code when the abort callback stopped it

# The abort callback is libc's strlen over the cancel token's two-byte flag ("\x01\0" -> 1 -> abort):
# llama.cpp calls it between graph nodes, and a C function costs nothing and never needs the GIL.
_ABORT_READER_ADDRESS: int | None = None

_init_lock = threading.Lock()
_initialised = False


def import_llama_cpp(abi_record: Path | None = None) -> tuple[Any, abi.ByValueCalls]:
    """The bindings, imported tolerantly (see binding.py), and the by-value calls with the library's layouts.

    With ``abi_record`` (what ``semif-ops image abi verify`` proved for this library: the image build, or an
    operator by hand) the struct layouts come from it and a library of another version is refused; without
    one, the library must be the llama.cpp build the binding was written for, and the binding's layouts are
    used. Either way every symbol the engine calls must be exported.
    """
    llama_cpp = binding.load(REQUIRED_SYMBOLS)
    raw = llama_cpp.llama_cpp
    if abi_record is not None:
        layouts = binding.check_recorded(raw._lib, abi_record, llama_cpp.__version__)
    else:
        layouts = binding.binding_layouts_for(raw._lib, raw, llama_cpp.__version__)
    try:
        calls = abi.ByValueCalls(raw._lib, layouts)
    except abi.LayoutError as exc:
        raise binding.BindingError(f"{exc} ({abi_record or 'the binding'})") from None
    return llama_cpp, calls


def _load_backend_plugins(llama_cpp: Any) -> None:
    """Load ggml backend plugins (e.g. the DLC's CUDA backend) when the library is built with them."""
    directory = os.environ.get("GGML_BACKEND_DIR") or os.environ.get("LLAMA_CPP_LIB_PATH")
    try:
        ggml = (
            ctypes.CDLL("libggml.so")
            if directory is None
            else ctypes.CDLL(str(Path(directory) / "libggml.so"))
        )
    except OSError:
        return
    if directory and hasattr(ggml, "ggml_backend_load_all_from_path"):
        ggml.ggml_backend_load_all_from_path.argtypes = [ctypes.c_char_p]
        ggml.ggml_backend_load_all_from_path(directory.encode())
    elif hasattr(ggml, "ggml_backend_load_all"):
        ggml.ggml_backend_load_all()


_LOG_CALLBACK: Any = None
# The token of the decode in flight: llama.cpp logs an aborted decode as an error, which it is not when
# the abort was asked for (a deadline or a caller who left).
_ACTIVE_CANCEL: Deadline | None = None


def _init_backend(llama_cpp: Any, verbose: bool) -> None:
    global _initialised, _LOG_CALLBACK
    with _init_lock:
        if _initialised:
            return

        @llama_cpp.llama_log_callback  # type: ignore[untyped-decorator]  # llama_cpp is untyped
        def _log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
            if not text:
                return
            message = text.decode("utf-8", "replace")
            capture = _LOAD_LOG
            if capture is not None:
                capture.append(message)
            if verbose:
                sys.stderr.write(message)
            elif level == 4:  # GGML_LOG_LEVEL_ERROR
                if _ACTIVE_CANCEL is not None and _ACTIVE_CANCEL.cancelled:
                    log.info("llama.cpp (decode aborted on request): %s", message.rstrip())
                else:
                    log.error("llama.cpp: %s", message.rstrip())

        _LOG_CALLBACK = _log  # keep a reference: llama.cpp holds the raw pointer
        llama_cpp.llama_log_set(_log, ctypes.c_void_p(0))
        _load_backend_plugins(llama_cpp)
        llama_cpp.llama_backend_init()
        _initialised = True


def gpu_device_present() -> bool:
    """Whether the llama.cpp library registers a GPU device (CUDA, ...): layers may be offloaded to it, and
    llama.cpp may send a large call there even with none offloaded. Loads the bindings and backends once,
    as the first :class:`LlamaRuntime` would."""
    llama_cpp = binding.load(REQUIRED_SYMBOLS)
    _init_backend(llama_cpp, verbose=False)
    return bool(llama_cpp.llama_supports_gpu_offload())


# What llama.cpp logs while one model loads (the weights' buffer types are only said there).
_LOAD_LOG: list[str] | None = None
_load_lock = threading.Lock()


@contextlib.contextmanager
def _load_log() -> Iterator[list[str]]:
    global _LOAD_LOG
    with _load_lock:
        lines: list[str] = []
        _LOAD_LOG = lines
        try:
            yield lines
        finally:
            _LOAD_LOG = None


def _check_struct_layout(cparams: Any) -> None:
    """Symbols can all exist while a struct changed shape under the binding; defaults expose that."""
    plausible = (
        cparams.n_seq_max == 1
        and 0 < cparams.n_batch <= 1 << 20
        and 0 < cparams.n_ubatch <= cparams.n_batch
        and cparams.n_ctx <= 1 << 24
    )
    if not plausible:
        raise ModelLoadError(
            "llama_context_default_params() returned implausible values (n_seq_max="
            f"{cparams.n_seq_max}, n_batch={cparams.n_batch}, n_ubatch={cparams.n_ubatch}): the loaded "
            "libllama does not match llama-cpp-python's struct layout (binding/library ABI drift)"
        )


class LlamaRuntime:
    """One model and one context: sequence 0 holds the prefix, the others decision branches (one branch
    in the fixed split; ``n_seq_max - 1`` decoded together, each in its own KV stream, when invariant)."""

    def __init__(
        self,
        path: Path,
        *,
        n_ctx: int,
        n_batch: int,
        n_threads: int,
        n_gpu_layers: int,
        verbose: bool = False,
        abi_record: Path | None = None,
        invariant: bool = False,
        n_seq_max: int = 2,
        flash_attention: bool = False,
        extra_buffers: str = "auto",
    ) -> None:
        """``invariant``: the batch-invariant configuration (``numerics``): weight repacking and flash
        attention off, and one KV stream per sequence (``n_seq_max`` of them, each of ``n_ctx`` cells);
        otherwise two sequences share one unified KV cache of ``n_ctx`` cells. ``extra_buffers``:
        SEMIF_CPU_EXTRA_BUFFERS (``kernels.extra_buffers``)."""
        llama_cpp, self.abi = import_llama_cpp(abi_record)
        self.lib = llama_cpp
        _init_backend(llama_cpp, verbose)
        if not path.is_file():
            raise ModelLoadError(f"GGUF file not found: {path}")
        self.gpu_offload = bool(llama_cpp.llama_supports_gpu_offload())
        if n_gpu_layers != 0 and not self.gpu_offload:
            raise ModelLoadError(
                f"GPU offload requested (n_gpu_layers={n_gpu_layers}) but the loaded llama.cpp library "
                "has no GPU backend; set SEMIF_N_GPU_LAYERS=0 for CPU or use the GPU image"
            )
        self._load_model(path, n_gpu_layers, invariant, extra_buffers)
        if not self.model:
            raise ModelLoadError(f"llama.cpp could not load {path} (not a GGUF, or unsupported architecture)")
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self.vocab))
        self.is_recurrent = bool(llama_cpp.llama_model_is_recurrent(self.model))
        self.is_hybrid = bool(llama_cpp.llama_model_is_hybrid(self.model))
        # flash attention in invariant numerics: every piece padded to the tiled path's rows, its filler
        # dropped after the call, which only memory that can drop a sequence's tail allows (the probe
        # judges the rest); the filler's cells are reserved beyond n_ctx in every stream
        drops_tails = not (self.is_recurrent or self.is_hybrid)
        tiled = invariant and flash_attention and drops_tails and n_batch >= FLASH_TILE_ROWS
        self.min_rows = FLASH_TILE_ROWS if tiled else 0

        cparams = self._context_params(
            n_ctx + self.min_rows, n_batch, n_threads, invariant, n_seq_max, flash_attention
        )
        self.ctx = self.abi.init_from_model(self.model, cparams)
        if not self.ctx:
            llama_cpp.llama_model_free(self.model)
            raise ModelLoadError(f"llama.cpp could not create a context of {n_ctx} tokens for {path}")
        self.n_ctx = n_ctx
        self.n_batch = n_batch
        self.invariant = invariant
        self.n_seq_max = int(cparams.n_seq_max)
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.batch = self.abi.batch_init(n_batch, 0, 1)
        self.n_swa = int(llama_cpp.llama_model_n_swa(self.model))  # > 0: sliding-window layers
        self._token_lengths: dict[int, int] = {}
        self._closed = False

    def _load_model(self, path: Path, n_gpu_layers: int, invariant: bool, extra_buffers: str) -> None:
        """Load the weights, into llama.cpp's extra buffer types only where ``kernels.extra_buffers``
        allows; note which buffer types they went into and which CPU backend library is mapped."""
        self.cpu_features = kernels.cpu_features(self.system_info())  # fixed once the backends are in
        amx = kernels.advertises_amx(kernels.read_cpu_flags(), self.cpu_features)
        self.extra_buffers = kernels.extra_buffers(extra_buffers, invariant=invariant, amx=amx)
        mparams = self.abi.model_default_params()
        mparams.n_gpu_layers = 0x7FFFFFFF if n_gpu_layers < 0 else n_gpu_layers
        mparams.use_extra_bufts = self.extra_buffers.use  # repacking, and AMX where advertised
        with _load_log() as load_log:
            self.model = self.abi.model_load_from_file(str(path).encode(), mparams)
        self.weight_buffers = kernels.weight_buffers(load_log)
        # no /proc (macOS): the libllama file the binding opened still names the build
        self.library_files = kernels.read_mapped_library_paths() or binding.loaded_library_files(
            self.lib.llama_cpp._lib
        )

    def _context_params(
        self, n_ctx: int, n_batch: int, n_threads: int, invariant: bool, n_seq_max: int, flash_attention: bool
    ) -> Any:
        """``llama_context_params`` for the fixed split (two sequences in one unified KV cache) or the
        invariant configuration (one KV stream of ``n_ctx`` cells per sequence)."""
        cparams = self.abi.context_default_params()
        _check_struct_layout(cparams)
        n_streams = n_seq_max if invariant else 1
        cparams.n_ctx = n_ctx * n_streams  # llama.cpp gives each stream n_ctx / n_seq_max cells
        cparams.n_batch = n_batch
        cparams.n_ubatch = n_batch  # one decode call = one compute graph: a fixed, known split
        cparams.n_seq_max = n_seq_max if invariant else 2
        cparams.n_threads = n_threads
        cparams.n_threads_batch = n_threads
        # fixed split: a seq copy shares cells instead of copying KV data; invariant: each sequence in a
        # stream of its own, its cells where a lone sequence's would be (attention reduces in cell order)
        cparams.kv_unified = not invariant
        if invariant:  # flash attention's tiles follow the batch: off unless asked for (the probe judges)
            cparams.flash_attn_type = 1 if flash_attention else 0  # LLAMA_FLASH_ATTN_TYPE_{ENABLED,DISABLED}
        cparams.swa_full = True  # no sliding-window pruning: the prefix stays intact for every branch
        cparams.embeddings = False
        cparams.no_perf = True
        return cparams

    # --- vocabulary -----------------------------------------------------------------------
    def tokenize(self, text: str, special: bool) -> list[int]:
        """Token ids of ``text``; ``special=False`` keeps control-token text as plain text."""
        data = text.encode("utf-8")
        capacity = len(data) + 8
        for _ in range(2):
            buf = (self.lib.llama_token * capacity)()
            n = self.lib.llama_tokenize(self.vocab, data, len(data), buf, capacity, False, special)
            if n >= 0:
                return list(buf[:n])
            capacity = -n
        raise EngineFailure(f"tokenization failed for a text of {len(data)} bytes")

    def piece(self, token: int) -> str:
        buf = ctypes.create_string_buffer(256)
        n = self.lib.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
        return buf.raw[: max(n, 0)].decode("utf-8", "replace")

    def token_length(self, token: int) -> int:
        """Bytes of text ``token`` stands for as plain text (memoised: chunking maps text to tokens)."""
        length = self._token_lengths.get(token)
        if length is None:
            buf = ctypes.create_string_buffer(256)
            n = self.lib.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
            length = self._token_lengths[token] = n if n >= 0 else -1  # -1: too long, no anchors
        return length

    def is_control(self, token: int) -> bool:
        return bool(self.lib.llama_vocab_is_control(self.vocab, token))

    @property
    def add_bos(self) -> bool:
        return bool(self.lib.llama_vocab_get_add_bos(self.vocab))

    @property
    def bos(self) -> int:
        return int(self.lib.llama_vocab_bos(self.vocab))

    @property
    def eos(self) -> int:
        return int(self.lib.llama_vocab_eos(self.vocab))

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = self.lib.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            self.lib.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    def chat_template(self) -> str | None:
        raw = self.lib.llama_model_chat_template(self.model, None)
        return raw.decode("utf-8") if raw else None

    # --- the build ----------------------------------------------------------------------------
    def build_commit(self) -> str | None:
        """The llama.cpp commit the library reports (``ggml_commit``), None where it exports none."""
        return binding.library_version(self.lib.llama_cpp._lib).commit

    @property
    def cpu_library_files(self) -> list[Path]:
        """The CPU backend's files among those mapped at load (``library_files``: libllama, ggml's too)."""
        return kernels.cpu_library_paths(self.library_files)

    @property
    def cpu_library(self) -> str | None:
        """The CPU backend's library files mapped at load, by name (``kernels.library_names``)."""
        return kernels.library_names(self.cpu_library_files)

    def system_info(self) -> str:
        """``llama_print_system_info()``: the backends and the CPU features their kernels were built
        with (the variant loaded, where the build carries several); "" where the library lacks it."""
        try:
            raw = self.lib.llama_print_system_info()
        except binding.MissingSymbolError:
            return ""
        return raw.decode("utf-8", "replace") if raw else ""

    # --- decoding ---------------------------------------------------------------------------
    def decode(
        self,
        tokens: Sequence[int],
        start_pos: int,
        seq: int,
        want_logits: bool,
        chunk_size: int = 0,
        cancel: Deadline | None = None,
    ) -> None:
        """Decode ``tokens`` in fixed chunks (``n_batch`` unless smaller); logits only for the last token.

        With ``cancel``, the token is checked before every chunk and, on CPU, between graph nodes; an
        abort raises the token's error. llama.cpp removes the aborted chunk's positions itself; the
        caller still owns the sequence and must drop or reset it.
        """
        step = min(chunk_size, self.n_batch) if chunk_size > 0 else self.n_batch
        with self._abortable(cancel):
            for offset in range(0, len(tokens), step):
                chunk = tokens[offset : offset + step]
                last = offset + len(chunk) == len(tokens)
                self._call([Part(chunk, start_pos + offset, seq, want_logits and last)], cancel)

    @contextlib.contextmanager
    def _abortable(self, cancel: Deadline | None) -> Iterator[None]:
        """llama.cpp's abort callback reads ``cancel``'s flag for the calls made inside."""
        if cancel is None:
            yield
            return
        global _ACTIVE_CANCEL
        self._set_abort_flag(cancel.flag_address)
        _ACTIVE_CANCEL = cancel
        try:
            yield
        finally:
            _ACTIVE_CANCEL = None
            self._set_abort_flag(None)

    def _set_abort_flag(self, address: int | None) -> None:
        global _ABORT_READER_ADDRESS
        if address is None:
            self.lib.llama_set_abort_callback(self.ctx, self.lib.ggml_abort_callback(), None)
            return
        if _ABORT_READER_ADDRESS is None:
            _ABORT_READER_ADDRESS = ctypes.cast(ctypes.CDLL(None).strlen, ctypes.c_void_p).value
        callback = self.lib.ggml_abort_callback(_ABORT_READER_ADDRESS)
        self.lib.llama_set_abort_callback(self.ctx, callback, ctypes.c_void_p(address))

    def decode_parts(self, parts: Sequence[Part], cancel: Deadline | None = None) -> list[int]:
        """Decode several sequences' tokens in ONE ``llama_decode`` call (at most ``n_batch`` tokens);
        returns, per part that wants logits, the batch row of its last token (for :meth:`logits_at`).

        llama.cpp splits the call into micro-batches itself (equal token counts per sequence when the KV
        cache has a stream per sequence); the engine's planner decides which parts may share a call.
        """
        total = sum(len(p.tokens) for p in parts)
        if not 0 < total <= self.n_batch:
            raise EngineFailure(f"a shared decode call of {total} tokens (n_batch {self.n_batch})")
        with self._abortable(cancel):
            return self._call(parts, cancel)

    def _call(self, parts: Sequence[Part], cancel: Deadline | None) -> list[int]:
        """One ``llama_decode`` of ``parts`` (the token checked first); the rows that carry logits.

        With ``min_rows`` (flash attention in invariant numerics), a part shorter than that is padded
        to it here and its filler's cells are dropped after the call, so no sequence ever takes the
        per-row kernel; planners that put several parts in one call pad them to ``min_rows`` or more
        themselves (``calls.floored``), since llama.cpp's split of unequal parts makes short pieces."""
        if cancel is not None:
            cancel.check()
        floored = [p for p in parts if len(p.tokens) < self.min_rows]
        if floored:
            parts = [p.padded(self.min_rows) for p in parts]
            if sum(len(p.tokens) for p in parts) > self.n_batch:
                raise EngineFailure(f"a call padded to {self.min_rows} rows a sequence exceeds n_batch")
        rows = self._decode_batch(parts, cancel)
        for part in floored:
            self.drop(part.seq, part.end)
        return rows

    def _decode_batch(self, parts: Sequence[Part], cancel: Deadline | None) -> list[int]:
        batch = self.batch
        rows: list[int] = []
        i = 0
        for part in parts:
            for offset, token in enumerate(part.tokens):
                batch.token[i] = token
                batch.pos[i] = part.start_pos + offset
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = part.seq
                batch.logits[i] = False
                i += 1
            if part.want_logits:
                row = i - 1 - part.filler
                batch.logits[row] = True
                rows.append(row)
        batch.n_tokens = i
        started = time.perf_counter()
        rc = self.abi.decode(self.ctx, batch)
        if rc == DECODE_ABORTED and cancel is not None and cancel.cancelled:
            raise cancel.error()
        if rc != 0:
            where = f" ({len(parts)} sequences)" if len(parts) > 1 else ""
            raise EngineFailure(f"llama_decode failed with code {rc} at position {parts[0].start_pos}{where}")
        if cancel is not None:
            cancel.advance(i, time.perf_counter() - started)
        return rows

    def logits_at(self, row: int) -> np.ndarray:
        """A zero-copy float32 view of the logits of batch row ``row`` of the last call."""
        ptr = self.lib.llama_get_logits_ith(self.ctx, row)
        if not ptr:
            raise EngineFailure(f"llama.cpp returned no logits for batch row {row}")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def last_logits(self) -> np.ndarray:
        """A zero-copy float32 view of the last output position's logits (valid until the next decode)."""
        ptr = self.lib.llama_get_logits_ith(self.ctx, -1)
        if not ptr:
            raise EngineFailure("llama.cpp returned no logits for the last position")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    # --- sequences ------------------------------------------------------------------------
    def clear(self, wipe: bool = False) -> None:
        """Empty every sequence; ``wipe`` also zeroes the cells' data (milliseconds per thousand cells).

        Without it the cells keep stale keys and values, which no result can see: a cell outside a
        sequence is masked, and attention skips it (flash attention) or weighs it by an exact zero.
        Only a non-finite stale value could leak (0 × inf is NaN), so after a failure, wipe.
        """
        self.lib.llama_memory_clear(self.memory, wipe)

    def fork(self, src: int = PREFIX_SEQ, dst: int = BRANCH_SEQ) -> None:
        self.lib.llama_memory_seq_cp(self.memory, src, dst, -1, -1)

    def drop(self, seq: int, start: int = -1) -> None:
        """Remove sequence ``seq`` from position ``start`` on (all of it by default)."""
        if not self.lib.llama_memory_seq_rm(self.memory, seq, start, -1):
            raise EngineFailure(f"llama.cpp could not remove sequence {seq} from position {start}")

    def save_seq(self, seq: int) -> ctypes.Array[ctypes.c_uint8]:
        size = int(self.lib.llama_state_seq_get_size(self.ctx, seq))
        buf = (ctypes.c_uint8 * size)()
        written = int(self.lib.llama_state_seq_get_data(self.ctx, buf, size, seq))
        if written != size:
            raise EngineFailure(f"sequence state save wrote {written} of {size} bytes")
        return buf

    def restore_seq(self, seq: int, data: ctypes.Array[ctypes.c_uint8]) -> None:
        self.drop(seq)
        if int(self.lib.llama_state_seq_set_data(self.ctx, data, len(data), seq)) == 0:
            raise EngineFailure("sequence state restore failed")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.abi.batch_free(self.batch)
        self.lib.llama_free(self.ctx)
        self.lib.llama_model_free(self.model)

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter exit
        try:
            self.close()
        except Exception:
            pass
