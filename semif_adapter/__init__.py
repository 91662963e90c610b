"""semif-adapter: probabilities over declared options, read from a GGUF model's last-position logits."""

__version__ = "0.1.0"
