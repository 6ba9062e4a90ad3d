"""The notebook parts: %%gpu magics, cell code analysis, the cell's live display."""
