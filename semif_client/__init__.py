"""Client-side helpers for callers of a deployed semif-adapter (not used by the server)."""
