"""llama-cpp-python's own OpenAI-compatible server, started the way our engine loads weights on this CPU.

The stock server asks llama.cpp for its default model parameters, which put the weights in extra buffer
types; on a CPU that advertises AMX, with a build that has AMX kernels, that is ggml's AMX buffer type,
whose kernels die with a general protection fault at the first decode on an Intel VM (the crash
``kernels.extra_buffers`` keeps our engine out of). This launcher switches extra buffers off in exactly
that case and otherwise runs the server untouched. Run it as ``python -m tests.helpers.chat_server``
with the server's own arguments."""

from __future__ import annotations

from typing import Any

from llama_cpp import llama_cpp as lib
from llama_cpp.server.__main__ import main as serve

from semif_adapter.engine import kernels


def needs_plain_buffers() -> bool:
    features = kernels.cpu_features(lib.llama_print_system_info().decode(errors="replace"))
    return kernels.advertises_amx(kernels.read_cpu_flags(), features)


def main() -> None:
    if needs_plain_buffers():
        stock = lib.llama_model_default_params

        def plain_buffers() -> Any:
            params = stock()
            params.use_extra_bufts = False
            return params

        lib.llama_model_default_params = plain_buffers  # read by Llama() when the server loads the model
    serve()


if __name__ == "__main__":
    main()
