"""``semif-ops image``: the build context, the CodeBuild image build, Dockerfile checks, the layout probe."""
