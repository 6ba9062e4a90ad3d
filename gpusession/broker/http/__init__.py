"""The broker's read-only status endpoint over HTTP, and the file that announces it."""
