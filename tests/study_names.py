"""Names the tests check study A's records and CSVs by; the library lists none of them (a trainable reports what
it measures and the engine forwards every number, listed nowhere)."""
from pefusion import record as R

# The PE-fusion trainable's per-epoch metrics (MLflow step = epoch).
EPOCH_METRICS = (R.TRAIN_LOSS, R.VAL_LOSS, R.VAL_ACC)
# The final metrics of a PE-fusion trial (docs/operations.md, MLflow).
FINAL_METRICS = (R.PARAMS, R.BEST_VAL_ACC, R.BEST_EPOCH, R.VAL_ACC, R.TEST_ACC, R.TEST_MACRO_F1, R.LAT_MS_MEAN,
                 R.LAT_MS_STD, R.TRAIN_TIME_S, R.EPOCHS_RUN)
# Metrics that vary between identical runs (clocks and what is computed from them): left out wherever two runs,
# or a resumed sweep and an uninterrupted one, are compared (docs/operations.md: equal "timing columns aside").
TIMING_METRICS = (R.LAT_MS_MEAN, R.LAT_MS_STD, R.TRAIN_TIME_S, R.TRAIN_SAMPLES_PER_S, R.TRAIN_TOKENS_PER_S,
                  R.EPOCH_S, R.PEAK_MEM_ALLOC_MIB, R.PEAK_MEM_RESERVED_MIB, R.WALL_S, R.STARTED_AT, R.ENDED_AT)
# Columns of the by-seed CSV that vary between identical runs (left out when comparing two sweeps).
TIMING_COLUMNS = (*TIMING_METRICS, "trial_id", R.VISIBLE_DEVICES, R.NODE)
# The fusions released in the paper's code.
PAPER_FUSIONS = ("add", "mul", "concat", "gate_scalar", "mlp")
