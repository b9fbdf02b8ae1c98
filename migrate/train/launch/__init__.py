"""Several processes: msrun's launcher (`msrun`), the worker it starts on every rank (`worker`),
the files they share (`worker_files`, `cluster`).
"""
