"""What a run tells the world (Observer, RunInfo) and the renderers that draw it: console
lines, the notebook's live cell view, the status line, the receipt."""
