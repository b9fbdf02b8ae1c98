"""Training checkpoints: the folder's files (`files`), writing, opening and merging folders
(`folder`), per-rank optimizer shards (`shards`).
"""
