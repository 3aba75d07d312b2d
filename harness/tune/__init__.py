"""Optuna studies over engine knobs, driven through the runner (see the tuning issue)."""
