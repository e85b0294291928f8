"""Recording, below the sweep engine and the analysis: the MLflow tracking store (`store`: its URI, a reachability
check, a client, a new sqlite store from a template, the UI's link), where records came from (`provenance`), the
writes made off Tune's loop and waiting out an outage (`writer`), one sweep's runs (`recorder`), a trial's runs and
records (`trials`) and the Ray Tune callback that turns trial events into MLflow runs (`callbacks`).

It imports neither study nor the engine; importing the package imports nothing heavy (MLflow and Ray load with the
modules that need them)."""
