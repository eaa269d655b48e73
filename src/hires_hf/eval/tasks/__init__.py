"""Offline lm-eval tasks (YAML + jsonl) built from held-out Python stdlib files; see generate.py."""
