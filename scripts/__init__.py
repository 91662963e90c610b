"""Operator scripts (packaging, image builds, SageMaker deployment). Each module has ``main(argv) -> int``."""
