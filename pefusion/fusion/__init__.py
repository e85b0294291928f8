"""Study A, positional-encoding fusion (Hallam & Tseng): the configs, presets and rules; the positional schemes;
the fusion operators; the classifier and its CPU attention kernel; the training loop; the Ray Tune trainable; a
finished trial's model as an MLflow model that classifies raw text."""
