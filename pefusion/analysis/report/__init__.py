"""One self-contained HTML page per sweep, logged back to the sweep's MLflow parent run with the files it shows:
`page` composes it (the sweep's header, the remarks a reader must know, the failed trials, the files) from one
module per section, each writing its tables and figures (`fusion`, `student`, `search`: the study's or the
search's own sections; `compute`: what any sweep cost), over `markup`, the HTML every section writes in.
"""
