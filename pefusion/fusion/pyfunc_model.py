"""MLflow's models-from-code file of an exported classifier: `export` logs this file with the model, and MLflow runs
it when the model is loaded (`mlflow.pyfunc.load_model`, `mlflow models serve`). The model is then built from
pefusion's own class and the model's artifacts; nothing is unpickled. Not meant to be imported."""
import mlflow

from pefusion.fusion.export import TextClassifier

mlflow.models.set_model(TextClassifier())
