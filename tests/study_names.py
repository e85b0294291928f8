"""Names the tests check study A's records and CSVs by; the library lists none of them (a trainable reports what
it measures and the engine forwards every number, listed nowhere)."""
from pefusion import record as R

# The PE-fusion trainable's per-epoch metrics (MLflow step = epoch).
EPOCH_METRICS = (R.TRAIN_LOSS, R.VAL_LOSS, R.VAL_ACC)
# The final metrics of a PE-fusion trial (SPEC §3).
FINAL_METRICS = (R.PARAMS, R.BEST_VAL_ACC, R.BEST_EPOCH, R.VAL_ACC, R.TEST_ACC, R.TEST_MACRO_F1, R.LAT_MS_MEAN,
                 R.LAT_MS_STD, R.TRAIN_TIME_S, R.EPOCHS_RUN)
# Columns of the by-seed CSV that vary between identical runs (left out when comparing two sweeps).
TIMING_COLUMNS = (R.LAT_MS_MEAN, R.LAT_MS_STD, R.TRAIN_TIME_S, "trial_id", "visible_devices", "started_at",
                  "ended_at", R.NODE)
# The fusions released in the paper's code.
PAPER_FUSIONS = ("add", "mul", "concat", "gate_scalar", "mlp")
