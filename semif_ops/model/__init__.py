"""``semif-ops model``: package a pinned GGUF into model.tar.gz, here or in CodeBuild."""
