"""Documents to token ids: file and hub readers, the train-only vocabulary, the token-id cache, length-bucketed
batches, and the bundled synthetic corpus. Knows nothing of models, sweeps or MLflow."""
