"""Bundled MindSpore models whose parameter names are the keymaps' targets."""
