"""Operator tooling for semif-adapter (``semif-ops``): package models, build images, run SageMaker endpoints.

Kept apart from the runtime package: the server image never installs it, and its AWS dependencies come from
the ``ops`` extra. One module per operation, grouped by what it acts on (model, image, endpoint).
"""
