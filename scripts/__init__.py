"""Developer scripts run from the repository: the GPU check (``gpu_bundle``, ``gpu_check.sh``,
``gpu_report``) and the golden answers (``golden``, ``make golden``). Operator tools live in ``semif_ops``."""
