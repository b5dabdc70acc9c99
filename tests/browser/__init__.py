"""The dashboard and the API docs in a real headless Chromium."""
