"""From MLflow runs to the papers' tables and figures: loading runs, the tables of both studies, Markdown/LaTeX
formats, figures and the HTML report. Reads MLflow; writes only through pefusion.tracking."""
