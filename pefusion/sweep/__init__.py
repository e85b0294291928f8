"""The sweep engine, which knows neither study: the search-space schema, the options every sweep shares and the one
place that settles them, Ray Tune plumbing, the progress lines and how each trial ended, and the one driver every
sweep runs through. What a sweep records in MLflow is `pefusion.tracking`'s, the layer below."""
