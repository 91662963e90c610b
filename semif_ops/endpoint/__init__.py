"""``semif-ops endpoint``: deploy, invoke, scale, clean up SageMaker endpoints and run batch transforms."""
