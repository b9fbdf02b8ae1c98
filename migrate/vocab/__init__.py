"""Vocabulary checks and resizing: does the tokenizer agree with the config and the embedding?

`facts` reads what each file says (tokenizer, config.json, generation_config.json, model.yaml,
checkpoint headers); `model_checks` and `data_checks` turn them into `Finding`s; `resize` grows or
pads the embedding and lm_head of a converted model (and of its HF source) with a stated init.
"""
