"""One optimizer step: its cells (`cells`), the optimizer step's graphs (`optimizer`), the step
faults (`faults`), the step-time profile (`profile`).
"""
