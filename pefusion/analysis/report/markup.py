"""The HTML every section of the report writes in: the page's style, a table for reading (a box that scrolls
sideways, numbers right-aligned) and a figure embedded in the page, so that the page stands alone.
"""
from __future__ import annotations

import base64
import html
import re
from pathlib import Path

import pandas as pd

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1300px; padding: 0 1em; color: #222; }
.table { max-width: 100%; overflow-x: auto; margin: 0.5em 0 1.5em; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 3px 6px; text-align: left; }
th.num, td.num { text-align: right; }
th { background: #f3f3f3; vertical-align: bottom; max-width: 11em; }
td { max-width: 28em; overflow-wrap: anywhere; }
code, pre { background: #f6f6f6; padding: 2px 4px; white-space: pre-wrap; word-break: break-all; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.5em 0; }
.note { color: #8a5a00; } .muted { color: #666; font-size: 0.9em; }
table.meta td, table.meta th { text-align: left; vertical-align: top; max-width: none; }
"""


def table_html(shown: pd.DataFrame, caption: str = "") -> str:
    """A table for reading (a frame of strings, formats.display or a study's *_display), in a box that scrolls
    sideways on a narrow window instead of running off the page, with a one-line caption above it."""
    above = f"<p class='muted'>{html.escape(caption)}</p>" if caption else ""
    if shown.empty:
        return above + "<p class='muted'>(none)</p>"
    cells = shown.astype(str).replace({"nan": "–", "<NA>": "–", "None": "–"})
    numeric = [bool(cells[c].map(lambda v: bool(_NUMERIC.match(v))).all()) for c in cells]  # right-aligned
    head = "".join(f"<th class='{'num' if n else 'text'}'>{html.escape(str(c))}</th>" for c, n in zip(cells, numeric))
    body = "".join("<tr>" + "".join(f"<td class='{'num' if n else 'text'}'>{html.escape(v)}</td>"
                                    for v, n in zip(row, numeric)) + "</tr>" for row in cells.itertuples(index=False))
    return above + f"<div class='table'><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"


_NUMERIC = re.compile(r"^(–|[-−+]?[\d.,]+(e[-+]?\d+)?( ± [\d.,e+-]+)?|\[[-\d., ]+\])$")


def image_html(png: Path, caption: str = "") -> str:
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    text = f"<figcaption class='muted'>{html.escape(caption)}</figcaption>" if caption else ""
    return f"<figure><img alt='{html.escape(png.stem)}' src='data:image/png;base64,{data}'>{text}</figure>"
