"""The sweep engine, which knows neither study: the search-space schema, Ray Tune plumbing, MLflow tracking (the
project's only MLflow writer) and the one driver every sweep runs through."""
