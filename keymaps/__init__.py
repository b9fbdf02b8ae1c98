"""The bundled keymaps (one YAML per source family), installed with the package as data."""
