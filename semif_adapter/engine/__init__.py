"""The engine layer: one llama.cpp context that scores decisions.

``decision_engine`` plans and scores requests; ``prompt`` and ``labels`` turn decisions into tokens;
``prefix_cache`` keeps saved prefix states; ``deadline`` is the cancel token the HTTP layer hands down;
``llama_backend`` drives llama.cpp's C API through the bindings that ``binding`` loads.
Nothing here imports the HTTP layer.
"""

from semif_adapter.engine.decision_engine import DecisionEngine

__all__ = ["DecisionEngine"]
