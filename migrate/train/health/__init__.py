"""The health watch: its decisions (`watch`), its log and saved batches (`log`), `migrate health`'s
summary (`summary`).
"""
