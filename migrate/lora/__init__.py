"""LoRA on the converted model, proven against PEFT: what an adapter is (`spec`), which layers it
adapts and under which names on each side (`targets`), PEFT's adapter folders (`peft_files`) and the
moves between the two ecosystems (`transfer`: export, import, merge). MindSpore-free; the
MindSpore side of the adapter is `migrate.lora.cells`, the training side `migrate.train.lora_run`.
"""
