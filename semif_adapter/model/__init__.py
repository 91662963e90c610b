"""The model on disk: its manifest, calibration, discovery in the model directory, the demo models."""
