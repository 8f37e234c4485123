"""A chaos run: workers of three kinds on one queue, a nemesis, a history and its checker."""
