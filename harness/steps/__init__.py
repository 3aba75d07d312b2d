"""Engine step traces on the driver side: kept beside each row, fitted into a step model, replayed for predictions.

- ``store``: one Parquet file per run (``results/steps/<run_id>.parquet``) and the row's summary columns;
- ``fit``: the step model (``engines.stepmodel``) fitted from traces, with bounds and residuals;
- ``predict``: predictions from a fitted model (a replay's rate, the full-engine rate) as row columns.

Which step model applies on a host, and each run's prediction, are ``harness.run.stepmodels``.
"""
