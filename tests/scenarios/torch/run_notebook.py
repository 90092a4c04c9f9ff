# Runs a notebook in a real Jupyter kernel (nbclient + ipykernel, the interpreter's own kernel),
# and prints one JSON line: each code cell's text outputs and the kinds of rich output.
import json
import sys

import nbformat
from nbclient import NotebookClient

nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(nb, timeout=600, kernel_name="python3").execute()
cells = []
for cell in nb.cells:
    if cell.cell_type != "code":
        continue
    text, rich = "", {}
    for out in cell.get("outputs", []):
        text += out.get("text", "")
        for kind, value in out.get("data", {}).items():
            rich[kind] = value if kind == "text/plain" else len(value)
            if kind == "text/html":
                rich["html_has_view"] = "<iframe" in value and "oomtrace" in value
    cells.append({"text": text, "rich": rich})
print(json.dumps(cells), flush=True)
